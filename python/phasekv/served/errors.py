"""The errors of phasekv.served: all are phasekv.InputError (so the CLI's exit code 2 covers them)."""

from __future__ import annotations

from .. import _phasekv as _pk


class ServedInputError(_pk.InputError):
    """Bad input to a served-model measurement (the message names the field and the value)."""


class MissingPackageError(ServedInputError, ImportError):
    """An optional package a tokenizer adapter needs is not installed (the message names it)."""


class PlacementError(ServedInputError):
    """A prompt whose planned tokens cannot be placed or would not land where planned."""


class EndpointError(ServedInputError):
    """A server that cannot run the measurement (unreachable, no logprobs, ...)."""
