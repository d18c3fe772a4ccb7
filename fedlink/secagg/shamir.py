"""Shamir secret sharing over the prime field GF(2**255 - 19).

A secret ``s < P`` is the constant term of a random polynomial of degree ``threshold - 1``;
share ``x`` is the point ``(x, f(x))`` for a non-zero ``x``. Any ``threshold`` shares give ``s``
by Lagrange interpolation at 0; fewer give no information about it. The prime is the one of
Curve25519, so a 32-byte secret below it (a self-mask seed, an X25519 private key drawn below
it) is one field element, and a share is an ``x`` and 32 bytes.

No well-kept Python package offers plain Shamir sharing over a prime field (the ones on the
package index are unmaintained or tied to SLIP-39 mnemonics); the arithmetic is the textbook
one, held to fixed vectors and to the threshold property in the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from fedlink.secagg.base import SecAggError

PRIME = (1 << 255) - 19
"""The field's prime, 2^255 - 19."""

RandomBelow = Callable[[int], int]
"""``random_below(n)``: a uniformly random integer in ``[0, n)`` (``secrets.randbelow``)."""


def split(secret: int, xs: Sequence[int], threshold: int,
          random_below: RandomBelow) -> dict[int, int]:
    """``{x: f(x)}`` for each ``x`` in ``xs``: shares of ``secret``, any ``threshold`` of which
    rebuild it."""
    if not 0 <= secret < PRIME:
        raise SecAggError("a shared secret must be a field element (below 2^255 - 19)")
    if not 2 <= threshold <= len(xs):
        raise SecAggError(f"threshold {threshold} needs 2..{len(xs)} shares")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise SecAggError("share points must be distinct and non-zero")
    coefficients = [secret] + [random_below(PRIME) for _ in range(threshold - 1)]
    return {x: _evaluate(coefficients, x) for x in xs}


def reconstruct(shares: Iterable[tuple[int, int]], threshold: int) -> int:
    """The secret from at least ``threshold`` shares ``(x, y)`` (the first ``threshold`` are
    used). ``SecAggError`` when there are too few or two share one ``x``."""
    points = list(shares)[:threshold] if threshold > 0 else []
    if len(points) < max(threshold, 2):
        raise SecAggError(f"{len(points)} shares given, {threshold} needed")
    xs = [x % PRIME for x, _ in points]
    if len(set(xs)) != len(xs):
        raise SecAggError("two shares at one point")
    secret = 0
    for j, (xj, yj) in enumerate(points):
        numerator, denominator = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                numerator = numerator * xm % PRIME
                denominator = denominator * (xm - xj) % PRIME
        secret = (secret + yj * numerator * pow(denominator, -1, PRIME)) % PRIME
    return secret


def _evaluate(coefficients: list[int], x: int) -> int:
    """``f(x)`` by Horner's rule, mod the prime."""
    value = 0
    for c in reversed(coefficients):
        value = (value * x + c) % PRIME
    return value
