"""Adapters broken on purpose, each in one way, to prove the suite bites.

Each module names the checks it must fail in ``BREAKS``, and those it fails
only when concurrent steps happen to interleave in ``MAY_BREAK`` (if any);
the test suite runs the conformance checks on every one and requires that
every check of BREAKS fails and no check outside the two does.
Never use them for data.
"""
