"""pyrevolve drop-in: change ``from pyrevolve import Revolver`` to
``from asyncckpt.compat import Revolver`` and keep your operators and checkpoint objects.

``Revolver(checkpoint, fwd_operator, rev_operator, n_checkpoints, n_timesteps)`` takes pyrevolve
2.2.8's arguments, positionally. With ``n_checkpoints=None`` (Devito's wavesolvers) it runs
asynchronous multistage checkpointing within a memory budget; with a number of slots and no
Level-2 named it is pyrevolve's Revolver (Revolve in those slots alone); with a Level-2 named
(any of the keywords below but ``taping``, or its variable) the slots are the Level-1 budget of
the asynchronous strategy. Level-2 and the interval come from keyword options, else from the
environment, else from their defaults:

============================  ===========================  =======================================
keyword                       environment variable         default
============================  ===========================  =======================================
``storage``                   ``ASYNCCKPT_STORAGE``        host DRAM (``dram``); else a directory
``interval``                  ``ASYNCCKPT_INTERVAL``       ``auto`` (chosen by the model); ``0``
                                                           with slots and no Level-2 named
``taping``                    ``ASYNCCKPT_TAPING``         ``1`` (pyrevolve's protocol); ``0``:
                                                           the taping-free reverse
``memory_budget``             ``ASYNCCKPT_MEMORY_BUDGET``  with ``n_checkpoints=None``: a quarter
                                                           of the available memory
``compression_params``        ``ASYNCCKPT_COMPRESSION``    none; pyrevolve's dicts, or asyncckpt's
                                                           ``compression=`` spelled as text
                                                           (``lz4``, ``zfp:tolerance=1e-6``)
============================  ===========================  =======================================

Other keywords go to :class:`asyncckpt.AsyncCheckpointer`. pyrevolve itself is never imported.

The rest of pyrevolve's surface, for programs that use more than ``Revolver``:
``SingleLevelRevolver``, ``MemoryRevolver`` and ``DiskRevolver`` (Revolve in one storage, where
pyrevolve stores), ``MultiLevelRevolver`` (H-Revolve over a storage list), the storages
``NumpyStorage``, ``DiskStorage`` and ``BytesStorage`` (``asyncckpt.compat.storage``),
compression (``asyncckpt.compat.compression``), ``Profiler``, and the classic
action-by-action Revolve (``asyncckpt.compat.crevolve``: ``CRevolve``, ``Action``,
``adjust``). To run a program written for pyrevolve unchanged, :func:`install` (or ``python -m asyncckpt.compat PROGRAM [ARGS]``) makes
``import pyrevolve`` give this package.

"""
from __future__ import annotations

from ._install import install, uninstall
from ._levels import DiskRevolver, MemoryRevolver, MultiLevelRevolver, SingleLevelRevolver
from ._revolver import (Checkpoint, Operator, Revolver, choose_l1_slots,
                        compression_from_pyrevolve, default_budget, taping_from_environment)
from .compression import CompressedObject
from .crevolve import Action, CRevolve, RevolveError, adjust, expense, maxrange, numforw
from .profiling import Profiler
from .storage import BytesStorage, DiskStorage, NumpyStorage

__all__ = ["Revolver", "SingleLevelRevolver", "MemoryRevolver", "DiskRevolver",
           "MultiLevelRevolver", "Operator", "Checkpoint", "CompressedObject", "NumpyStorage",
           "DiskStorage", "BytesStorage", "Profiler", "install", "uninstall", "choose_l1_slots",
           "compression_from_pyrevolve", "default_budget", "taping_from_environment",
           "Action", "CRevolve", "RevolveError", "adjust", "expense", "maxrange", "numforw"]
