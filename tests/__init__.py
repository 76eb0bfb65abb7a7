"""The test suite. Every test folder is a package, so test files of the same name in
different folders (``unit/sdk/test_transport.py``, ``unit/streams/worker/test_transport.py``)
import under distinct names, and helpers import from any folder as ``tests.support.<name>``."""
