"""TRL GRPOConfig names in barerl configs: renamed onto barerl's keys, moot with a notice, unsupported at
TRL's default only; in files, on the command line and through config_from_dict."""

import dataclasses
import warnings

import pytest

from barerl.config import ConfigError
from barerl.train.config import GRPOConfig, build_argparser, config_from_dict, load_config
from barerl.train.data import encode_prompt
from barerl.train.episode import ChatTokens
from barerl.train.trl_names import MOOT, RENAMED, TRL_GRPO_NAMES, UNSUPPORTED, TRLNameNotice, names_of

# TRL 1.16's GRPOConfig names that barerl's GRPOConfig does not define (trl/trainer/grpo_config.py)
TRL_ONLY = ("model_init_kwargs", "trust_remote_code", "router_aux_loss_coef", "disable_dropout",
            "cast_lm_head_to_fp32", "remove_unused_columns", "num_generations_eval", "ds3_gather_for_generation",
            "pad_to_multiple_of", "generation_kwargs", "repetition_penalty", "cache_implementation", "use_vllm",
            "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
            "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
            "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
            "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
            "vespo_lambda_neg", "multi_objective_aggregation", "sync_ref_model", "ref_model_mixup_alpha",
            "ref_model_sync_steps", "entropy_coef", "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max",
            "entropy_coef_delta", "entropy_target", "max_tool_calling_iterations",
            "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
            "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "off_policy_mask_threshold",
            "use_bias_correction_kl", "log_completions", "log_multimodal", "num_completions_to_print",
            "log_unique_prompts", "log_completions_hub_repo", "use_transformers_continuous_batching",
            "transformers_continuous_batching_config", "use_transformers_paged", "vllm_importance_sampling_cap")
IMPLEMENTED = ("chat_template_kwargs", "delta", "top_entropy_quantile")  # TRL's names, now barerl fields

TRL_YAML = """\
model: Qwen/Qwen3-0.6B
dataset: data.jsonl
learning_rate: 1.0e-6
beta: 0.0
logging_steps: 5
use_vllm: true
vllm_mode: colocate
vllm_gpu_memory_utilization: 0.5
vllm_importance_sampling_correction: true
vllm_importance_sampling_mode: token_truncate
vllm_importance_sampling_clip_max: 2.0
max_tool_calling_iterations: 3
log_completions: true
num_completions_to_print: 4
pad_to_multiple_of: null
trust_remote_code: true
chat_template_kwargs: {enable_thinking: false}
delta: 1.5
top_entropy_quantile: 0.2
sapo_temperature_neg: 1.05
entropy_coef: 0.0
use_bias_correction_kl: true
sync_ref_model: false
"""


def _load(tmp_path, text, flags=()):
    path = tmp_path / "trl.yaml"
    path.write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(GRPOConfig, path, list(flags))
    return cfg, [str(w.message) for w in caught if w.category is TRLNameNotice]


def test_the_table_covers_trls_names_barerl_lacks():
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert set(TRL_GRPO_NAMES) == set(TRL_ONLY)
    assert not fields & set(TRL_GRPO_NAMES) and set(IMPLEMENTED) <= fields
    assert {e.kind for e in TRL_GRPO_NAMES.values()} == {RENAMED, MOOT, UNSUPPORTED}


def test_a_trl_config_loads_with_one_notice_per_renamed_or_moot_key(tmp_path):
    cfg, notices = _load(tmp_path, TRL_YAML)
    assert (cfg.importance_sampling_mode, cfg.importance_sampling_cap, cfg.importance_sampling_correction) == (
        "token_truncate", 2.0, True)
    assert cfg.max_turns == 4 and cfg.log_completions_steps == 5  # 3 tool rounds after the first turn; logging_steps
    assert cfg.chat_template_kwargs == {"enable_thinking": False}
    assert (cfg.delta, cfg.top_entropy_quantile) == (1.5, 0.2)
    noted = {n.split("TRL's ")[1].split(" ")[0] for n in notices}
    assert noted == {"use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_importance_sampling_correction",
                     "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                     "max_tool_calling_iterations", "log_completions", "num_completions_to_print",
                     "pad_to_multiple_of", "trust_remote_code"}  # unsupported names at TRL's default: silent
    assert all(n.startswith(f"config file {tmp_path / 'trl.yaml'}: TRL's ") and "\n" not in n for n in notices)
    assert any("max_turns=4" in n for n in notices)


@pytest.mark.parametrize("key,value,field,expected", [
    ("vllm_importance_sampling_correction", "false", "importance_sampling_correction", False),
    ("vllm_importance_sampling_mode", "sequence_truncate", "importance_sampling_mode", "sequence_truncate"),
    ("vllm_importance_sampling_clip_max", "5", "importance_sampling_cap", 5.0),
    ("vllm_importance_sampling_cap", "1.5", "importance_sampling_cap", 1.5),
    ("max_tool_calling_iterations", "0", "max_turns", 1),
    ("log_completions", "false", "log_completions_steps", 0),
    ("disable_dropout", "true", "lora_dropout", 0.0),
    ("generation_kwargs", '{"temperature": 0.7, "top_k": 20}', "temperature", 0.7),
    ("model_init_kwargs", '{"torch_dtype": "bfloat16", "attn_implementation": "sdpa"}', "dtype", "bfloat16"),
])
def test_renamed_values_land_in_barerls_field(key, value, field, expected):
    with pytest.warns(TRLNameNotice, match=f"TRL's {key} is barerl's"):
        cfg = load_config(GRPOConfig, None, [f"--{key}", value])
    assert getattr(cfg, field) == expected


def test_a_renamed_key_and_its_barerl_key_disagreeing_in_one_place_are_refused(tmp_path):
    text = "vllm_importance_sampling_mode: token_mask\nimportance_sampling_mode: sequence_mask\n"
    with pytest.raises(ConfigError, match="TRL's vllm_importance_sampling_mode means importance_sampling_mode="
                                          "'token_mask', but importance_sampling_mode is given as 'sequence_mask'"):
        _load(tmp_path, text)
    cfg, _ = _load(tmp_path, "vllm_importance_sampling_mode: token_mask\n", ["--importance_sampling_mode",
                                                                               "token_truncate"])
    assert cfg.importance_sampling_mode == "token_truncate"  # the command line over the file
    cfg, _ = _load(tmp_path, "importance_sampling_mode: token_mask\n", ["--vllm_importance_sampling_mode",
                                                                          "token_truncate"])
    assert cfg.importance_sampling_mode == "token_truncate"


@pytest.mark.parametrize("key,value,match", [
    ("vllm_importance_sampling_clip_max", "None", "always has a cap"),
    ("generation_kwargs", '{"num_beams": 4}', r"generation_kwargs \['num_beams'\]"),
    ("model_init_kwargs", '{"revision": "main"}', r"model_init_kwargs \['revision'\]"),
])
def test_renamed_values_barerl_cannot_take(key, value, match):
    with pytest.raises(ConfigError, match=match):
        load_config(GRPOConfig, None, [f"--{key}", value])


def test_moot_names_are_accepted_at_any_ordinary_value():
    values = {"use_vllm": True, "vllm_mode": "colocate", "vllm_server_host": "10.0.0.1", "vllm_server_port": 9000,
              "vllm_enable_sleep_mode": True, "vllm_model_impl": "transformers", "cache_implementation": "static",
              "ds3_gather_for_generation": True, "pad_to_multiple_of": 64, "remove_unused_columns": True,
              "log_completions_hub_repo": "me/completions", "use_transformers_continuous_batching": True,
              "transformers_continuous_batching_config": {"max_batch_tokens": 256}, "log_multimodal": False,
              "vllm_max_model_length": 4096, "num_generations_eval": 4, "trust_remote_code": True}
    with pytest.warns(TRLNameNotice) as record:
        assert config_from_dict(GRPOConfig, values) == GRPOConfig()
    assert len(record) == len(values) and all("has no effect in barerl" in str(w.message) for w in record)


@pytest.mark.parametrize("flags,match", [
    (["--vllm_mode", "server", "--vllm_server_base_url", "http://localhost:8000"], "no separate generation server"),
    (["--vllm_server_base_url", "http://localhost:8000"], "never with a server"),
    (["--vllm_tensor_parallel_size", "2"], "data parallel processes"),
    (["--ds3_gather_for_generation", "false"], "no ZeRO-3"),
])
def test_moot_values_that_ask_for_what_barerl_does_not_do(flags, match):
    with pytest.raises(ConfigError, match=f"command line: .*{match}"):
        load_config(GRPOConfig, None, flags)


def test_unsupported_names_load_at_trls_default_silently():
    defaults = {name: TRL_GRPO_NAMES[name].default for name in names_of(UNSUPPORTED)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config_from_dict(GRPOConfig, defaults) == GRPOConfig()


@pytest.mark.parametrize("key,value,reason", [
    ("sapo_temperature_neg", "2.0", "loss_type 'sapo'"),
    ("vespo_k_pos", "1", "loss_type 'vespo'"),
    ("entropy_coef", "0.01", "no entropy bonus"),
    ("use_adaptive_entropy", "true", "no entropy bonus"),
    ("sync_ref_model", "true", "frozen"),
    ("off_policy_mask_threshold", "0.5", "off-policy sequence masking"),
    ("repetition_penalty", "1.1", "repetition penalty"),
    ("router_aux_loss_coef", "0.001", "MoE"),
    ("vllm_structured_outputs_regex", "[0-9]+", "constrained decoding"),
    ("vllm_importance_sampling_clip_min", "0.5", "from above only"),
    ("use_bias_correction_kl", "false", None),  # barerl's own KL term: accepted
])
def test_unsupported_names_refuse_other_values(key, value, reason):
    if reason is None:
        load_config(GRPOConfig, None, [f"--{key}", value, "--beta", "0.04"])
        return
    with pytest.raises(ConfigError, match=f"TRL's {key} is not supported by barerl .*{reason}"):
        load_config(GRPOConfig, None, [f"--{key}", value])


def test_bias_corrected_kl_is_refused_only_with_a_kl_term():
    load_config(GRPOConfig, None, ["--use_bias_correction_kl", "true"])  # beta 0: nothing to correct
    with pytest.raises(ConfigError, match="use_bias_correction_kl is not supported.*with beta > 0"):
        load_config(GRPOConfig, None, ["--use_bias_correction_kl", "--beta", "0.04"])


def test_trl_flags_are_accepted_but_not_listed_in_help():
    with pytest.warns(TRLNameNotice):
        cfg = load_config(GRPOConfig, None, ["--use_vllm", "--vllm_importance_sampling_cap=2.5",
                                             "--chat_template_kwargs", '{"enable_thinking": false}'])
    assert cfg.importance_sampling_cap == 2.5 and cfg.chat_template_kwargs == {"enable_thinking": False}
    assert "use_vllm" not in build_argparser(GRPOConfig).format_help()
    with pytest.raises(ConfigError, match="unknown key 'use_vlm'.*did you mean"):
        load_config(GRPOConfig, None, ["--use_vlm"])  # not a TRL name: an error as before
    with pytest.raises(ConfigError, match="vllm_server_port: expected int"):
        load_config(GRPOConfig, None, ["--vllm_server_port", "http"])


def test_chat_template_kwargs_reach_the_template(chat_tokenizer):
    chat_tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                                    "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}")
    prompt = [{"role": "user", "content": "2+2?"}]
    text = lambda ids: chat_tokenizer.decode(ids)
    assert text(encode_prompt(prompt, chat_tokenizer)) == "2+2?\n"
    assert text(encode_prompt(prompt, chat_tokenizer, None, {"enable_thinking": False})) == "2+2?\n<no-think>"
    tokens = ChatTokens(chat_tokenizer, template_kwargs={"enable_thinking": False})
    assert text(tokens.prompt(prompt, [])) == "2+2?\n<no-think>"
