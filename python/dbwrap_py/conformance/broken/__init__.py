"""Adapters broken on purpose, each in one way, to prove the suite bites.

Each module names the checks it must fail in ``BREAKS``; the test suite runs
the conformance checks on every one and requires that exactly those fail.
Never use them for data.
"""
