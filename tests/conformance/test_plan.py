"""`kvcert plan`, the bundled model files and the Hugging Face config.json mapping."""

from __future__ import annotations

import json

import pytest

from kvcert.conformance.cli import main
from kvcert.conformance.contract.codec import InputError
from kvcert.conformance.contract.plans import plan_input_from_json
from kvcert.conformance.tools.catalog import (
    MODELS,
    load_model,
    model_names,
    parse_model,
)
from kvcert.conformance.tools.hf_config import from_hf_config
from kvcert.conformance.vllm.planner_model import vllm_padded_plan

REQUIRED_MODELS = {
    "gemma-4-31B",
    "gemma-4-26B-A4B",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "qwen3.5-35b-a3b",
    "qwen3-next-80b-a3b",
    "deepseek-v4-flash",
    "llama-4-scout",
    "jamba-v0.1",
    "llama-3.1-8b",
}


def test_the_issue_list_of_models_ships():
    assert set(model_names()) >= REQUIRED_MODELS


@pytest.mark.parametrize("name", model_names())
def test_every_bundled_model_parses_cites_and_plans(name, capsys):
    model = load_model(name)
    assert model.layers
    assert main(["plan", name, "--memory", "24", "--compare"]) == 0
    out = capsys.readouterr().out
    assert "capacity" in out
    assert "hit alignment" in out


def test_a_model_file_without_a_citation_is_refused():
    text = (MODELS / "gpt-oss-20b.json").read_text(encoding="utf-8")
    obj = json.loads(text)
    del obj["cite"]["layer_types.sliding.window"]
    with pytest.raises(InputError, match=r"no source cited for \['layer_types.sliding.window'\]"):
        parse_model(obj, "broken")
    obj = json.loads(text)
    obj["cite"]["layers"] = "nowhere"
    with pytest.raises(InputError, match="unknown sources"):
        parse_model(obj, "broken")


def test_gemma4_per_token_head_figures(capsys):
    """The closing-note figures: ours vs plain int8 vs vLLM's pad-to-largest, 30 GiB."""
    args = ["plan", "gemma-4-26B-A4B", "--memory", "30", "--json", "-", "--compare"]
    assert main([*args, "--kv-cache-dtype", "int8_per_token_head"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["token_capacity"] == 281570
    assert report["compare"]["this planner with plain int8"]["token_capacity"] == 285972
    padded = report["compare"]["vLLM 0.26-0.33 (pad the smaller page)"]
    assert padded["token_capacity"] == 258106
    assert {g["block_size"] for g in padded["groups"]} == {16}


def test_qwen35_reproduces_vllms_unified_block_size():
    obj = plan_json("qwen3.5-0.8b")
    assert {g["block_size"] for g in obj["plan"]["groups"]} == {544}


def plan_json(name, *extra):
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["plan", name, "--json", "-", *extra]) == 0
    return json.loads(buffer.getvalue())


def test_the_trade_off_table_marks_each_objectives_pick(capsys):
    assert main(["plan", "deepseek-v4-flash"]) == 0
    text = capsys.readouterr().out
    assert "objective balanced: the finest hit alignment within 95.0% of the most capacity" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line[:9].strip().isdigit()}
    assert rows["256"].endswith("balanced  <- this plan")
    assert "798,913" in rows["256"]
    assert "127.5" in rows["256"]
    assert rows["2048"].rstrip().endswith("capacity")
    assert rows["128"].rstrip().endswith("alignment")
    assert main(["plan", "deepseek-v4-flash", "--objective", "capacity"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()
            if line[:9].strip().isdigit()}  # fmt: skip
    assert rows["2048"].endswith("capacity  <- this plan")


def test_the_json_report_lists_every_option_the_objective_weighed():
    report = plan_json("qwen3.5-35b-a3b", "--objective", "alignment")
    options = report["options"]
    assert [o["hit_alignment"] for o in options] == [16, 32, 64, 128, 256, 512, 528, 1024, 1056]
    assert report["plan"] == {k: v for k, v in options[0].items() if k in report["plan"]}
    assert options[0]["chosen_by"] == ["alignment"]
    assert options[-1]["chosen_by"] == ["capacity"]
    assert options[-1]["expected_recompute"] == "1055/2"
    assert report["input"]["objective"] == "alignment"


def test_json_report_file_and_table(tmp_path, capsys):
    target = tmp_path / "plan.json"
    assert main(["plan", "llama-3.1-8b", "--json", str(target)]) == 0
    assert json.loads(target.read_text())["plan"]["groups"][0]["block_size"] == 16
    assert "llama-3.1-8b" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan"], "give a MODEL"),
        (["plan", "no-such-model"], "neither a bundled model"),
        (["plan", "llama-3.1-8b", "--memory", "0"], "--memory"),
        (["plan", "llama-3.1-8b", "--kv-cache-dtype", "fp4"], "kv_cache_dtype"),
        (["plan", "llama-3.1-8b", "--block-size", "20"], "multiples of 16"),
        (["plan", "llama-3.1-8b", "--group-padding", "x"], "group_padding"),
        (["plan", "llama-3.1-8b", "--memory", "0.0001"], "at least 2"),
        (["plan", "qwen3.5-0.8b", "--kernel-maximum", "256"], "state layers need"),
        (["plan", "llama-3.1-8b", "--kv-cache-dtype", "fp99"], "one of fp32, fp16, bf16, fp8,"),
        (["plan", "llama-3.1-8b", "--mamba-mode", "often"], "one of none, align, all, got"),
        (["plan", "llama-3.1-8b", "--speculative", "maybe"], "one of exact, drop, got 'maybe'"),
        (["plan", "llama-3.1-8b", "--capacity-share", "x"], "capacity_share: expected a number"),
        (["plan", "llama-3.1-8b", "--capacity-share", "0"], "capacity_share must be in (0, 1]"),
    ],
)
def test_bad_plan_requests_exit_2_with_what_to_fix(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "<" not in err, "an enum repr leaked into the message"


def test_plan_list(capsys):
    assert main(["plan", "--list"]) == 0
    assert "gemma-4-26B-A4B" in capsys.readouterr().out


def test_assumptions_are_printed(capsys):
    assert main(["plan", "deepseek-v4-flash", "--kv-cache-dtype", "fp8"]) == 0
    assert "ASSUMPTION" in capsys.readouterr().out


def test_vllm_model_refuses_what_it_cannot_model():
    obj = plan_json("deepseek-v4-flash")["input"]
    assert "refused" in vllm_padded_plan(plan_input_from_json(obj))


@pytest.mark.parametrize(
    ("model", "groups", "blocks"),
    [
        # vLLM 0.33.0's own planner gives these (kvcert.conformance.vllm.checks.plan, 30 GiB, bf16)
        ("gemma-4-26B-A4B", [("full", 32)] + [("sliding_window", 16)] * 5, 49152),
        ("gpt-oss-120b", [("full", 16), ("sliding_window", 16)], 54613),
        # chunked local: vLLM switches its hybrid manager off, one full-attention group
        ("llama-4-scout", [("full", 16)], 10240),
    ],
)
def test_vllm_model_matches_vllms_planner(model, groups, blocks):
    obj = {"layers": list(load_model(model).layers), "kv_cache_dtype": "bf16"}
    plan = vllm_padded_plan(plan_input_from_json({**obj, "memory_bytes": 30 << 30}))
    assert sorted((g["kind"], g["block_size"]) for g in plan["groups"]) == sorted(groups)
    assert plan["num_blocks"] == blocks


# --- Hugging Face config.json ---------------------------------------------------------------

GEMMA4 = {
    "model_type": "gemma4",
    "text_config": {
        "model_type": "gemma4_text",
        "num_hidden_layers": 6,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "num_global_key_value_heads": 2,
        "head_dim": 256,
        "global_head_dim": 512,
        "sliding_window": 1024,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16",
    },
}
QWEN_NEXT = {
    "model_type": "qwen3_next",
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "hidden_size": 2048,
    "full_attention_interval": 4,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32",
    "torch_dtype": "bfloat16",
}
JAMBA = {
    "model_type": "jamba",
    "num_hidden_layers": 8,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "torch_dtype": "bfloat16",
}
SCOUT = {
    "text_config": {
        "model_type": "llama4_text",
        "num_hidden_layers": 4,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "attention_chunk_size": 8192,
        "no_rope_layers": [1, 1, 1, 0],
        "torch_dtype": "bfloat16",
    }
}
DEEPSEEK = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 3,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}
LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "float16",
}

GEMMA3 = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "sliding_window": 1024,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
}


def test_hf_configs_map_field_by_field():
    gemma = from_hf_config(GEMMA4, "gemma4")
    assert gemma.layers[0]["kind"] == "sliding_window"
    assert gemma.layers[0]["window"] == 1024
    assert gemma.layers[5]["num_kv_heads"] == 2
    assert gemma.layers[5]["head_size_k"] == 512
    qwen = from_hf_config(QWEN_NEXT, "qwen")
    assert [x["kind"] for x in qwen.layers] == ["mamba", "mamba", "mamba", "full"] * 2
    assert qwen.layers[0]["tensors"] == [
        {"shape": [3, 6144], "dtype": "bf16"},
        {"shape": [16, 128, 128], "dtype": "fp32"},
    ]
    jamba = from_hf_config(JAMBA, "jamba")
    assert [x["kind"] for x in jamba.layers].index("full") == 4
    assert jamba.layers[4]["head_size_k"] == 128
    assert jamba.layers[0]["tensors"][0]["shape"] == [8192, 3]
    scout = from_hf_config(SCOUT, "scout")
    assert [x["kind"] for x in scout.layers] == ["chunked_local"] * 3 + ["full"]
    deepseek = from_hf_config(DEEPSEEK, "ds")
    assert deepseek.layers[0]["latent_size"] == 512
    llama = from_hf_config(LLAMA, "llama")
    assert llama.dtype == "fp16"
    assert llama.layers[0]["head_size_k"] == 128


def test_an_hf_config_file_plans(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA4))
    assert main(["plan", str(path), "--kv-cache-dtype", "int8_per_token_head"]) == 0
    assert "66,048" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**LLAMA, "compress_ratios": [0, 4]}, "compress_ratios"),
        ({**LLAMA, "hybrid_override_pattern": "M*"}, "hybrid_override_pattern"),
        ({**LLAMA, "layer_types": ["full_attention", "moe"]}, "not mapped"),
        ({**LLAMA, "layer_types": ["full_attention"]}, "must list 2"),
        ({**LLAMA, "torch_dtype": "int4"}, "torch_dtype"),
        ({**LLAMA, "num_hidden_layers": 0}, "num_hidden_layers"),
        ({**LLAMA, "num_key_value_heads": "8"}, "num_key_value_heads"),
        ({k: v for k, v in QWEN_NEXT.items() if k != "linear_num_key_heads"}, "linear_num_key"),
        ([1, 2], "JSON object"),
        ({**LLAMA, "num_attention_heads": 24}, "hidden_size 4096 is not a multiple of"),
        ({**LLAMA, "num_attention_heads": 30}, "num_key_value_heads 8 must divide"),
        ({**LLAMA, "num_key_value_heads": 64}, "num_key_value_heads 64 must divide"),
        ({**LLAMA, "max_position_embeddings": "4096"}, "max_position_embeddings"),
        ({**LLAMA, "max_position_embeddings": 0}, "max_position_embeddings"),
        ({**LLAMA, "max_position_embeddings": -5}, "max_position_embeddings"),
        ({**LLAMA, "num_kv_shared_layers": 4}, "num_kv_shared_layers"),
        ({**LLAMA, "model_type": "newlm", "sliding_window": 4096}, "no field says which layers"),
        ({**LLAMA, "model_type": "newlm", "attention_chunk_size": 8192}, "no_rope_layers nor"),
        (
            {**GEMMA3, "layer_types": ["full_attention"] * 6},
            "layer_types and sliding_window_pattern disagree",
        ),
    ],
)
def test_unmappable_hf_configs_are_refused_by_field(config, message):
    with pytest.raises(InputError, match=message):
        from_hf_config(config, "config.json")


SW, FULL = "sliding_window", "full"


@pytest.mark.parametrize(
    ("config", "expected", "rule"),
    [
        (GEMMA3, [SW] * 5 + [FULL], "sliding_window_pattern=6"),
        ({**GEMMA3, "sliding_window_pattern": 2}, [SW, FULL] * 3, "sliding_window_pattern=2"),
        (
            {k: v for k, v in GEMMA3.items() if k != "sliding_window_pattern"},
            [SW] * 5 + [FULL],
            "gemma3_text's default pattern 6",
        ),
        ({**GEMMA3, "model_type": "gemma2", "sliding_window_pattern": None}, [SW, FULL] * 3, "2"),
        (
            {
                **GEMMA3,
                "model_type": "gemma4_text",
                "num_hidden_layers": 8,
                "sliding_window_pattern": None,
            },
            [SW] * 5 + [FULL, SW, FULL],
            "the last layer full",
        ),
        ({**LLAMA, "model_type": "mistral", "sliding_window": 4096}, [SW, SW], "every layer"),
        (
            {
                **LLAMA,
                "model_type": "qwen2",
                "sliding_window": 4096,
                "use_sliding_window": False,
                "max_window_layers": 1,
            },
            [FULL, FULL],
            "no field names another kind",
        ),
        (
            {
                **LLAMA,
                "model_type": "qwen2",
                "sliding_window": 4096,
                "use_sliding_window": True,
                "max_window_layers": 1,
            },
            [FULL, SW],
            "max_window_layers=1",
        ),
        ({**SCOUT["text_config"], "no_rope_layers": None}, ["chunked_local"] * 3 + [FULL], "4"),
    ],
)
def test_pattern_fields_and_family_defaults_decide_the_layer_kinds(config, expected, rule):
    """Once every Gemma 2/3 layer was planned as sliding window when layer_types was absent."""
    mapped = from_hf_config(config, "config.json")
    assert [layer["kind"] for layer in mapped.layers] == expected
    assert rule in mapped.notes[0]


def test_every_mapping_says_which_fields_it_read_and_which_it_ignored(tmp_path, capsys):
    qwen = from_hf_config(
        {
            **LLAMA,
            "model_type": "qwen2",
            "sliding_window": 4096,
            "use_sliding_window": False,
            "max_window_layers": 1,
        },
        "config.json",
    )
    assert "use_sliding_window" in qwen.notes[1]
    assert qwen.notes[2] == "cache-relevant fields present but not used: max_window_layers"
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "model_type": "newlm"}))
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note: layer kinds: no field names another kind: every layer full attention" in out
    assert "note: model_type 'newlm' is not one kvcert has checked" in out
    assert "num_key_value_heads" in out  # among the fields read
