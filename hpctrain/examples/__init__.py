"""Small entry points that exercise the runtime (``entrypoint: hpctrain.examples.<module>:main``)."""
