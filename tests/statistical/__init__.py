"""Statistical tests: randomized code against its law, fixed seeds, tolerances from binomial or normal standard errors
(tests/ldp_stats.py)."""
