# Type stubs of phasekv.probe (the extension's submodule; phasekv::diag::probe, study/needle_probe.hpp).

from typing import ClassVar, Sequence, Union

import numpy as np
from numpy.typing import NDArray

from ._phasekv import FailureAttribution, Geometry, RecordShape, SweepConfig, SweepResult

Positions = Union[Sequence[int], NDArray[np.int64]]

class NeedlePolicy:
    full_attention: ClassVar[NeedlePolicy]
    mean_pool: ClassVar[NeedlePolicy]
    concentrated_gates: ClassVar[NeedlePolicy]
    rope_after_pool: ClassVar[NeedlePolicy]
    deepseek_v4_csa: ClassVar[NeedlePolicy]
    fixed_weight: ClassVar[NeedlePolicy]
    positional_gates: ClassVar[NeedlePolicy]
    __members__: ClassVar[dict[str, NeedlePolicy]]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class NeedleOutcome:
    success: ClassVar[NeedleOutcome]
    probability: ClassVar[NeedleOutcome]
    attributed: ClassVar[NeedleOutcome]
    __members__: ClassVar[dict[str, NeedleOutcome]]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class NeedleConfig:
    tokens: int
    records: int
    channels: int
    kappa: float
    logit_scale: float
    policy: NeedlePolicy
    stride: int
    window: int
    gate_offset: int
    heads: int
    seed: int
    origin: int
    key_slot_bias: list[float]
    value_slot_bias: list[float]
    record: RecordShape
    slot_profile: list[float]
    gate_content: float
    top_k: int
    isolate_targets: bool
    def __init__(
        self, *, tokens: int = 131072, records: int = 16000, channels: int = 64, kappa: float = 0.2,
        logit_scale: float = 0.0, policy: NeedlePolicy = ..., stride: int = 4, window: int = 4, gate_offset: int = 0,
        heads: int = 1, seed: int = 1, origin: int = 0, key_slot_bias: list[float] = ...,
        value_slot_bias: list[float] = ..., record: RecordShape = ..., slot_profile: list[float] = ...,
        gate_content: float = 1.0, top_k: int = 0, isolate_targets: bool = False,
    ) -> None: ...
    def resolved_slot_profile(self) -> list[float]: ...
    def haystack_spacing(self) -> int: ...
    def effective_stride(self) -> int: ...
    def effective_window(self) -> int: ...
    def validate(self) -> None: ...

class NeedleProbe:
    def __init__(self, config: NeedleConfig) -> None: ...
    @property
    def config(self) -> NeedleConfig: ...
    @property
    def logit_scale(self) -> float: ...
    @property
    def query_position(self) -> int: ...
    def reseed(self, seed: int) -> None: ...
    def prepare(self, target_positions: Positions, query_position: int, context: int = 0) -> None: ...
    def trials(self, target_positions: Positions) -> NDArray[np.bool_]: ...
    def probabilities(self, target_positions: Positions) -> NDArray[np.float64]: ...
    def explain(self, target_position: int, read_threshold: float = 0.5, write_threshold: float = 0.5) -> FailureAttribution: ...
    def crowding(self, target_position: int) -> int: ...
    @property
    def stream_geometry(self) -> Geometry: ...

def needle_sweep(probe: NeedleProbe, config: SweepConfig, kind: NeedleOutcome = ...) -> SweepResult: ...
