"""Benchmarks: they measure and never assert, and are not part of `make test`.

* smb: smbtorture's path-contention-shared, every adapter against native tdb;
* micro: per-operation latency through Samba's dbwrap front end (bench_micro);
* memory: RSS and PSS per smbd client process;
* targets: which adapters to run, with their throwaway servers;
* charts, progress: the PNG charts and the progress bar.
"""
