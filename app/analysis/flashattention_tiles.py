"""The tile schedule's two shares on the FlashAttention page, kept apart: skipped tiles as a share of the tile
pairs, and scores as a share of the N² matrix. Edge tiles are smaller than the rest, so the two measures differ
(at N = 157 with 128-key tiles one of four tile pairs is skipped, but it holds 15 % of the scores, not 25 %)."""
from __future__ import annotations

from dataclasses import dataclass

from kernels.flash_trace import FlashTrace


@dataclass(frozen=True, slots=True)
class TileShares:
    pairs: int  # tile pairs in the grid
    skipped_pairs: int  # pairs wholly in the future: never loaded
    scores: int  # N²: every entry of the score matrix
    computed_scores: int  # entries the loaded pairs compute, masked extras on the diagonal included
    skipped_scores: int  # entries inside the skipped pairs

    @property
    def skipped_pair_share(self) -> float:
        return self.skipped_pairs / self.pairs if self.pairs else 0.0

    @property
    def computed_score_share(self) -> float:
        return self.computed_scores / self.scores if self.scores else 0.0

    @property
    def skipped_score_share(self) -> float:
        return self.skipped_scores / self.scores if self.scores else 0.0


def tile_shares(trace: FlashTrace) -> TileShares:
    skipped = [t for t in trace.tiles if t.status == "skipped"]
    return TileShares(
        pairs=len(trace.tiles), skipped_pairs=len(skipped), scores=trace.seq_len ** 2,
        computed_scores=sum(t.scores for t in trace.tiles),
        skipped_scores=sum((t.q_end - t.q_start) * (t.k_end - t.k_start) for t in skipped))
