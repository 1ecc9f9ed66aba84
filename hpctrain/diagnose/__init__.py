"""Finding what is wrong before and after a job: doctor, preflight, probes, data benchmarks."""
