"""Throwaway servers for tests and benchmarks: each starts a backend on
127.0.0.1 (or in namespaces the run makes) with temporary data, and stops
it by PID. No runtime module imports them: the framework finds an
adapter's through its test hooks (dbwrap_py.testing.hooks, the
``dbwrap_py.testing`` entry points)."""
