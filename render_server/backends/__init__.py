"""Which backends this machine offers: GPU and NVENC probes, the `auto` choice, doctor, bench."""
