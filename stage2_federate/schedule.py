"""Which rounds' global model is evaluated (``ldpfl federate --eval-every K``).

A run of R rounds evaluates the global model after every round t with t mod K = 0, and after the last round
(t = R), whose model is the run's result: ⌈R / K⌉ evaluations in all. The round loop asks :func:`is_evaluated`
for each round; a silo training component that calibrates its evaluation noise plans :func:`evaluations` of the
whole run as the silos' evaluation releases (``silo_training``). Nothing here draws a random number or reads a file.
"""

from __future__ import annotations

from ldpfl.mechanisms.validation import require_int_in_range


def is_evaluated(round_number: int, *, every: int, rounds: int) -> bool:
    """Return whether round ``round_number`` of a run of ``rounds`` rounds is evaluated: t mod K = 0 or t = R."""
    require_int_in_range("round", round_number, 1, rounds)
    require_int_in_range("eval_every", every, 1)
    return round_number % every == 0 or round_number == rounds


def evaluations(first: int, *, every: int, rounds: int) -> int:
    """Return how many of rounds 1 to ``first`` of a run of ``rounds`` rounds are evaluated (:func:`is_evaluated`).

    ⌊n / K⌋, plus the last round when ``first`` reaches it and K does not divide R: ⌈R / K⌉ for the whole run.
    """
    require_int_in_range("rounds evaluated so far", first, 0, rounds)
    require_int_in_range("eval_every", every, 1)
    return first // every + int(first == rounds and rounds % every != 0)
