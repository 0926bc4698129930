# SPDX-License-Identifier: Apache-2.0
"""Mooncake Store is not part of te's compatibility layer (only mooncake.engine is)."""

raise ImportError("mooncake.store: Mooncake Store is not provided by te's compatibility "
                  "layer (python/compat offers mooncake.engine.TransferEngine only; see "
                  "docs/mooncake-compat.md)")
