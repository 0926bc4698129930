# SPDX-License-Identifier: Apache-2.0
"""Mooncake Transfer Engine's Python API on top of te (opt-in compatibility layer).

Put ``python/compat`` (and te's ``python``) on the Python path, then use Mooncake's import:

    from mooncake.engine import TransferEngine

Only the transfer engine (``mooncake.engine``) is provided; Mooncake Store is not. See
docs/mooncake-compat.md for the mapping of initialize()'s arguments and of Mooncake's
environment variables to te's configuration, and for what te cannot honour.
"""

__all__ = ["engine"]
