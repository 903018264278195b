"""The in-process stack of the end-to-end tests, for the chaos checks."""

from tests.e2e.conftest import stack  # noqa: F401 - a fixture
