"""The planner layer through Python: formats, layouts, presets, plans, bad input."""

import pytest

import kvpage
from kvpage import Format

GIB = 1 << 30
MIB = 1 << 20


def test_formats():
    assert [str(f) for f in Format] == ["fp32", "fp16", "bf16", "fp8_e4m3", "int8", "int4_v1", "int4"]
    assert kvpage.format_of("INT8") is Format.INT8
    assert kvpage.format_of("fp8") is Format.FP8_E4M3
    assert kvpage.format_of(5) is Format.INT4_V1
    assert kvpage.format_of(6) is Format.INT4 and kvpage.format_of("int4") is Format.INT4
    with pytest.raises(kvpage.InvalidArgument, match="int3"):
        kvpage.format_of("int3")
    with pytest.raises(kvpage.InvalidArgument):
        kvpage.format_of(17)
    with pytest.raises(TypeError):
        kvpage.format_of(1.5)
    with pytest.raises(TypeError):
        kvpage.format_of(True)


def test_parse_size():
    assert kvpage.parse_size("80GiB") == 80 * GIB
    assert kvpage.parse_size("24GB") == 24_000_000_000
    assert kvpage.parse_size(" 1.5 GiB ") == 3 * GIB // 2
    assert kvpage.parse_size(4096) == 4096
    for bad in ["", "abc", "-5", "0", "5XB", "1e9"]:
        with pytest.raises(kvpage.InvalidArgument):
            kvpage.parse_size(bad)
    for bad in [0, -1, 1 << 64]:
        with pytest.raises(kvpage.InvalidArgument):
            kvpage.parse_size(bad)
    with pytest.raises(TypeError):
        kvpage.parse_size(1.5)


def test_layout_exact_bytes():
    l = kvpage.layout(80, 8, 128, 16, "fp16", "fp16")
    assert l.element_bytes_per_token == 327680
    assert l.page_bytes == 327680 * 16
    assert not l.needs_staging
    q = kvpage.layout(32, 8, 128, 32, Format.INT8, Format.INT4)
    assert q.k_block_bytes == 32 * 128 + 128 * 4
    assert q.v_block_bytes == 32 * 128 // 2 + 32 * 4 * 4
    assert q.needs_staging and q.staging_page_bytes == 32 * 8 * 32 * 128 * 4
    assert q.arena_bytes(100, 3) == 100 * q.page_bytes + 3 * q.staging_page_bytes
    with pytest.raises(kvpage.InvalidArgument, match="overflow"):
        q.arena_bytes(1 << 62)
    with pytest.raises(kvpage.InvalidArgument, match="even"):
        kvpage.layout(32, 8, 128, 15, "int4", "int4")
    with pytest.raises(kvpage.InvalidArgument, match="head_dim"):
        kvpage.layout(32, 8, 100)
    with pytest.raises(kvpage.InvalidArgument):
        kvpage.layout(1 << 40, 8, 128)
    with pytest.raises(TypeError):
        kvpage.layout("32", 8, 128)


def test_presets_and_gpus():
    names = [p.name for p in kvpage.presets()]
    for required in ["llama-3.1-8b", "llama-3.1-70b", "llama-2-7b", "mistral-7b", "qwen2.5-7b",
                     "qwen2.5-72b", "smollm2-135m"]:
        assert required in names
    s = kvpage.preset("SmolLM2-135M")
    assert (s.layers, s.q_heads, s.kv_heads, s.head_dim) == (30, 9, 3, 64)
    with pytest.raises(kvpage.NotFound, match="llama-3.1-8b"):
        kvpage.preset("gpt-5")
    assert kvpage.gpu("h100-80g").memory_bytes == 81559 * MIB
    assert len(kvpage.gpus()) == 7
    with pytest.raises(kvpage.NotFound):
        kvpage.gpu("b200")
    assert kvpage.weight_bytes(1000, "int4") == 532


def test_plan_str_names_model_gpu_and_budget():
    p = kvpage.plan(preset="llama-3.1-70b", gpu="h200-141g", context=32768)
    text = str(p)
    assert "llama-3.1-70b" in text and "h200-141g" in text
    assert p.weight_bytes == 2 * 70553706496
    assert p.kv_budget_bytes == int((143771 * MIB - p.weight_bytes) * 0.9)


def test_plan_matches_hand_arithmetic():
    p = kvpage.plan(preset="llama-3.1-8b", gpu="h100-80g", context=8192)
    budget = int((81559 * MIB - 2 * 8030261248) * 0.9)
    page = 2 * 32 * 8 * 128 * 2 * 16
    assert p.kv_budget_bytes == budget
    assert p.bytes_per_token == 131072
    assert p.num_pages == budget // page
    assert p.max_seqs == budget // (512 * page)
    assert p.arena_bytes <= p.kv_budget_bytes


def test_plan_by_shape_and_formats():
    p = kvpage.plan(layers=32, kv_heads=8, head_dim=128, k_format="int8", v_format="int4",
                    kv_budget="16GiB", context=1000, page_size=16)
    l = kvpage.layout(32, 8, 128, 16, "int8", "int4")
    assert p.needs_staging and p.pages_per_seq == 62
    assert p.seq_bytes == 62 * l.page_bytes + l.staging_page_bytes
    assert p.max_seqs == 16 * GIB // p.seq_bytes
    assert p.num_staging == p.max_seqs
    q = kvpage.plan(preset="mistral-7b", vram="24GB", weight_dtype="int4", reserve="1GiB")
    assert q.memory_bytes == 24_000_000_000 and q.reserve_bytes == GIB
    assert q.weight_bytes == kvpage.weight_bytes(7248023552, "int4")


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(preset="llama-3.1-8b"), kvpage.InvalidArgument, "no memory"),
    (dict(preset="llama-3.1-8b", gpu="h100-80g", vram="80GiB"), kvpage.InvalidArgument, "not both"),
    (dict(preset="llama-3.1-8b", kv_budget="1KiB"), kvpage.InvalidArgument, "smaller than one page"),
    (dict(preset="llama-3.1-70b", gpu="l4-24g"), kvpage.InvalidArgument, "do not fit"),
    (dict(preset="llama-3.1-8b", gpu="h100-80g", utilization=1.5), kvpage.InvalidArgument, "utilization"),
    (dict(preset="llama-3.1-8b", gpu="tpu"), kvpage.NotFound, "unknown GPU"),
    (dict(preset="nope", gpu="h100-80g"), kvpage.NotFound, "unknown preset"),
    (dict(layers=32, kv_heads=8, kv_budget="8GiB"), kvpage.InvalidArgument, "head_dim"),
    (dict(preset="llama-3.1-8b", kv_budget="8GiB", format="int8", k_format="int4"),
     kvpage.InvalidArgument, "not both"),
    (dict(preset="llama-3.1-8b", kv_budget="8GiB", gpu="h100-80g"), kvpage.InvalidArgument, "do not combine"),
    (dict(preset="llama-3.1-8b", kv_budget="8GiB", context=-1), kvpage.InvalidArgument, "context"),
    (dict(preset="llama-3.1-8b", kv_budget="8GiB", q_heads=12), kvpage.InvalidArgument, "multiple"),
    (dict(preset="llama-3.1-8b", gpu="cuda:x"), kvpage.InvalidArgument, "cuda:N"),
])
def test_plan_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        kvpage.plan(**kwargs)
