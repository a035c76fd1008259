"""End-to-end tests: the CLI, the Python API and the engines run as a user runs them, on small data."""
