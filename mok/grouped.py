"""Views over one grouped expert Parameter ``(E, rows, columns)``: TE's flat buffers, all
experts, read through te_compat, then planned by mok.plan."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from mok.backend import preference
from mok.errors import ExpertWeightError, RefreshError
from mok.formats import BlockFormat, Direction, Format, format_named
from mok.layout import grouped_scales
from mok.plan import DirectionSource, ScaleSource, ViewRequest, check_cached, plan_view
from mok.views import GroupedExpertWeights, ViewDirection, check_sizes, storage_view
from te_compat import GroupedStorage, StorageName, grouped_storage, storage_field, storage_reader, tensor_kind


def _check_grouped(gs: GroupedStorage, num_experts: int, rows: int, columns: int) -> None:
    if gs.num_tensors != num_experts:
        raise ExpertWeightError(f"grouped weight: expected {num_experts} experts; found {gs.num_tensors}")
    for e, shape in enumerate(gs.tensor_shapes):
        if tuple(shape) != (rows, columns):
            raise ExpertWeightError(
                f"grouped weight: expected every expert of shape ({rows}, {columns}); expert {e} has {tuple(shape)}"
            )


def _member_scales(fmt: BlockFormat, members: tuple[object, ...], d: Direction) -> list[Any]:
    """Each member's scales of direction ``d``: one C-level read per member where they share a
    class and hold the storage themselves (a snapshot of each of 256 members would cost
    milliseconds on a first view), else member by member through its snapshot."""
    reader = storage_reader(members[0], (str(d.scales),))
    if len(set(map(type, members))) == 1 and reader.read_one is not None:
        with contextlib.suppress(AttributeError):  # storage kept on .data only: read below
            return list(map(reader.read_one, members))
    return [storage_field(m, d.scales) for m in members]


def _check_packing(gs: GroupedStorage, fmt: BlockFormat, d: Direction, flat: torch.Tensor, per_expert: int) -> None:
    """Each member's scales must be a view at offset e*per_expert of the grouped buffer."""
    offsets = gs.rowwise_scale_inv_offsets if d.name == "rowwise" else gs.columnwise_scale_inv_offsets
    for e, off in enumerate((offsets or ())[: gs.num_tensors]):
        if off != e * per_expert:
            raise ExpertWeightError(
                f"grouped weight: {d.name} scale offsets are not expert-major: expert {e} starts "
                f"at byte {off}, expected {e * per_expert}"
            )
    if not gs.members:
        return
    if len(gs.members) != gs.num_tensors:
        raise ExpertWeightError(
            f"grouped weight: expected {gs.num_tensors} per-expert members; found {len(gs.members)}"
        )
    base = flat.data_ptr()
    for e, scales in enumerate(_member_scales(fmt, gs.members, d)):
        if scales is None:
            raise ExpertWeightError(f"grouped weight: expert {e} has no {d.name} scales")
        where = scales.data_ptr() - base
        if where != e * per_expert:
            found = f"byte {where} of it" if 0 <= where < flat.numel() else "outside it"
            raise ExpertWeightError(
                f"grouped weight: expert {e}'s {d.name} scales are not packed expert-major in the "
                f"grouped buffer: expected byte {e * per_expert}, found {found}"
            )


def _grouped_amax(weight: object, d: Direction) -> tuple[torch.Tensor, ...] | None:
    """The group's amax of direction ``d`` (NVFP4: one fp32 value per expert), if it keeps one."""
    amax = None if d.amax is None else storage_field(weight, d.amax)
    return (amax,) if isinstance(amax, torch.Tensor) else None


def _grouped_sources(
    weight: object, gs: GroupedStorage, fmt: BlockFormat, dims: tuple[int, int, int]
) -> list[DirectionSource]:
    experts, rows, columns = dims
    sources = []
    for d in fmt.directions():
        data = getattr(gs, d.data.value)
        if data is None:
            continue
        name = f"grouped {d.name}"
        payload = storage_view(
            data, (experts, *fmt.payload_shape(d, rows, columns)), dtype=fmt.payload_dtype, name=f"{name} data"
        )
        pr, pc = fmt.te_scale_shape(d, rows, columns)
        flat = gs.need(d.scales)
        padded = grouped_scales(flat, experts, pr, pc, f"{name} scales")
        _check_packing(gs, fmt, d, flat, pr * pc)
        ((buffer, geometry),) = fmt.scale_sources(d, (padded,), rows, columns, (f"{name} scales",))
        source = ScaleSource(f"{name} scales", buffer, geometry, gs.scales_swizzled)
        sources.append(DirectionSource(d, fmt.format, (payload,), (source,), _grouped_amax(weight, d)))
    if not sources or sources[0].direction.name != "rowwise":
        gs.need(StorageName.ROWWISE_DATA)  # raises, naming the attribute and release
    return sources


def read_grouped(weight: object, fmt: BlockFormat, dims: tuple[int, int, int]) -> list[DirectionSource]:
    """Every direction TE stores of the grouped weight, rowwise first."""
    gs = grouped_storage(weight)
    _check_grouped(gs, *dims)
    fmt.check_dims(dims[1], dims[2], "grouped weight")
    if not gs.quantized:
        raise ExpertWeightError("grouped weight holds no quantized data (no quantizer); pass format='bf16'")
    if gs.members and tensor_kind(gs.members[0]) is not fmt.kind:
        raise ExpertWeightError(
            f"grouped weight: expected {fmt.format.name} experts; found {type(gs.members[0]).__name__} members"
        )
    return _grouped_sources(weight, gs, fmt, dims)


def _grouped_bf16(weight: object, dims: tuple[int, int, int], cached: object) -> GroupedExpertWeights:
    if cached is not None:
        raise RefreshError("BF16 expert views are plain views of the parameter: nothing to refresh")
    gs = grouped_storage(weight)
    _check_grouped(gs, *dims)
    if gs.quantized:
        raise ExpertWeightError("grouped weight is quantized (it has a quantizer); pass use_mxfp8=True or format=")
    data = gs.need(StorageName.ROWWISE_DATA)
    view = storage_view(data, dims, dtype=torch.bfloat16, name="grouped rowwise data")
    return GroupedExpertWeights(*dims, Format.BF16, ViewDirection(Format.BF16, (view,)))


def grouped_weight_view(
    weight: object,
    *,
    num_experts: int,
    rows: int,
    columns: int,
    use_mxfp8: bool | None = None,
    format: str | None = None,
    cached: GroupedExpertWeights | None = None,
    backend: str | None = None,
) -> GroupedExpertWeights:
    """Views over one grouped Parameter ``(E, rows, columns)`` (TE 2.13 ``data`` and 2.14+
    ``rowwise_data`` naming, via te_compat). ``format``: "bf16", "mxfp8" or "nvfp4" (default
    from the seed's ``use_mxfp8``). With ``cached`` (a previous result), refresh its scale
    buffers in place and return it. One kernel launch on the cuda backend.

    Threads: refreshes of different views, and concurrent refreshes of one view, are safe (each
    writes every byte of the view's own buffers once, with its final value). A refresh racing
    another thread that makes TE reassign these weights' buffers is not: the check can pass just
    before TE moves a buffer, and the launch then reads the old one. Order the two yourself.
    """
    fmt = format_named(format, use_mxfp8)
    if fmt is Format.HYBRID:
        raise ValueError("format='hybrid': TE's hybrid weights are per-expert tensors; use split_weight_view")
    experts, rows, columns = check_sizes(num_experts=num_experts, rows=rows, columns=columns)
    dims = (experts, rows, columns)
    if fmt is Format.BF16:
        preference(backend)  # checked on every path, though a BF16 view converts nothing
        return _grouped_bf16(weight, dims, cached)
    key = ("grouped", fmt, dims, preference(backend))  # a changed TE_COMPAT_KERNEL_BACKEND re-plans
    if cached is not None:
        cached = check_cached(cached, GroupedExpertWeights, fmt, dims)  # type: ignore[assignment]
        if cached.refresh_plan.rerun((weight, *cached.refresh_plan.companions()), key):
            return cached
    sources = read_grouped(weight, fmt.block_format, dims)
    request = ViewRequest(dims, fmt, watched_group(weight), key, None, backend)
    return plan_view(GroupedExpertWeights, request, sources, cached)


def watched_group(weight: object) -> tuple[object, ...]:
    """What a refresh guard watches: the group, and where the group keeps no swizzled flag of its
    own (TE 2.13: te_compat reads it off the members), its members too. A rerun passes the group
    with the members planned with: the group's own storage holds its member list, so a new member
    list fails the guard."""
    members = storage_field(weight, StorageName.QUANTIZED_TENSORS)
    if members and storage_field(weight, StorageName.SCALES_SWIZZLED) is None:
        return (weight, *members)
    return (weight,)
