"""Wire models of held-out draws: a sealed generated split's rotation (server/draws.py).

A rotation draws a new held-out set from the server's secret and the next draw number;
every earlier draw is retired (never served for evaluation, never to training)."""

from __future__ import annotations

from pydantic import Field

from palaestra.sdk.models import PlainStr, WireModel


class HeldoutRotateRequest(WireModel):
    split: PlainStr | None = Field(
        default=None, description="the sealed generated split to redraw (none: every one)"
    )


class SplitDraw(WireModel):
    split: str
    draw: int = Field(description="the draw served now (0: the first)")
    previous: int | None = Field(
        default=None, description="the draw this rotation retired (none: not rotated now)"
    )
    drawn_at: float | None = Field(default=None, description="when the draw was made")
    drawn_by: str = ""
    tasks: int = Field(default=0, description="tasks of the draw in the newest served version")


class HeldoutDraws(WireModel):
    pack: str
    splits: list[SplitDraw]
