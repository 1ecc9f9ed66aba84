"""The remote wing: every verb from a laptop, through a cluster's login node (issue 39). Torch-free.

A cluster profile with ``login:`` (``jobspec/login.py``) is reached over ONE
OpenSSH ControlMaster connection per cluster: opened once interactively
(``hpctrain login NAME``: the password and the Duo/OTP code typed once) and
reused by every later command in BatchMode, so no command ever prompts again
or hangs waiting for a prompt. The login node runs the same hpctrain; this
wing ships what it needs (the spec and the project's code), runs the verb
there and brings back what it printed (and a report's figures).

* ``ssh.py`` -- the one place that starts ``ssh``: the private socket folder,
  check / open / run / close, and ssh's failures as typed ``RemoteError``.
* ``shipping.py`` -- what a submit sends (the project's files as a tar
  stream) and the laptop's record of a submit in flight (its token).
* ``stages.py`` -- the login node's shipped folders and when they go
  (``hpctrain remote prune``; runs on the login node, after each submit too).
* ``verbs.py`` -- the thin runner: the version check, a verb forwarded,
  submit and resume exactly once, report with its figures copied back.

Nothing on the task side imports this wing, and it imports nothing of the
task side: the login node's hpctrain does the work, through its own verbs.
"""
