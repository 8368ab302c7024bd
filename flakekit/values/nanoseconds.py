"""The two factors every lease and deadline is converted by: flakekit counts time in
integer nanoseconds, and stores and settings speak seconds and milliseconds."""

from __future__ import annotations

__all__ = ["NS_PER_MS", "NS_PER_S"]

#: nanoseconds in a second
NS_PER_S = 1_000_000_000
#: nanoseconds in a millisecond
NS_PER_MS = 1_000_000
