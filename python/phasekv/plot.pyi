# Type stubs of phasekv.plot (the extension's submodule; phasekv::diag::plot in C++).

from typing import Sequence

from ._phasekv import SweepResult

class PlotPoint:
    x: float
    y: float
    low: float  # NaN: no error bar
    high: float
    hollow: bool  # an open marker
    def __init__(self, *, x: float = 0.0, y: float = 0.0, low: float = ..., high: float = ..., hollow: bool = False) -> None: ...

class PlotSeries:
    label: str
    points: list[PlotPoint]  # a copy: assign a whole new list to change it
    dashed: bool
    def __init__(self, *, label: str = "", points: list[PlotPoint] = ..., dashed: bool = False) -> None: ...

class PlotAxes:
    title: str
    x_label: str
    y_label: str
    x_min: float
    x_max: float
    y_min: float
    y_max: float
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    x_boundaries: list[float]
    width: int
    height: int
    dodge_px: float
    filled_marker_meaning: str
    open_marker_meaning: str
    def __init__(
        self, *, title: str = "", x_label: str = "", y_label: str = "", x_min: float = 0.0, x_max: float = 1.0,
        y_min: float = 0.0, y_max: float = 100.0, x_ticks: list[tuple[float, str]] = ...,
        y_ticks: list[tuple[float, str]] = ..., x_boundaries: list[float] = ..., width: int = 960,
        height: int = 540, dodge_px: float = 0.0, filled_marker_meaning: str = ..., open_marker_meaning: str = ...,
    ) -> None: ...
    def validate(self) -> None: ...

def svg_line_plot(series: Sequence[PlotSeries], axes: PlotAxes) -> str: ...
def svg_escape(text: str) -> str: ...
def format_p_value(p: float) -> str: ...
def phase_sweep_series(result: SweepResult, label: str, profile: str = "all") -> PlotSeries: ...
