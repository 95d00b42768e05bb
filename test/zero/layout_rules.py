"""The parameter layout's size rules (src/model/layout.h, src/zero/partition.h), written out for
the multi-rank tests' independent arithmetic: what each unit holds, in elements, for a model
(L, C, T, Vp) at a world size and ZeRO stage. Shared by zero_equivalence.py and memory_formulas.py."""
import math


def pad_multiple(world):
    return world * 128 // math.gcd(world, 128)


def round_up(x, k):
    return (x + k - 1) // k * k


def embedding_chunks(L, C, T, VP, world):
    """Stage 3's embedding units (real element counts), by the rule layout.h states: each holds
    a padded block's worth of wte rows rounded down to a multiple of q = pad/gcd(pad, C) (at least
    q; so every chunk but the last is whole shards), the last one the remaining rows and wpe."""
    m = pad_multiple(world)
    q = m // math.gcd(m, C)
    rows = max(q, round_up(12 * C * C + 13 * C, m) // C // q * q)
    E = -(-VP // rows)
    if E == 1:
        return [(VP + T) * C]
    return [rows * C] * (E - 1) + [(VP - (E - 1) * rows + T) * C]


def unit_numels(L, C, T, VP, world=1, stage=0):
    """Real element counts of the units: the embedding (one unit, or stage 3's chunks when there
    is more than one rank), L blocks, the final norm."""
    emb = embedding_chunks(L, C, T, VP, world) if stage == 3 and world > 1 else [(VP + T) * C]
    return emb + [12 * C * C + 13 * C] * L + [2 * C]


def padded_units(L, C, T, VP, world, stage=0):
    m = pad_multiple(world)
    return [round_up(n, m) for n in unit_numels(L, C, T, VP, world, stage)]
