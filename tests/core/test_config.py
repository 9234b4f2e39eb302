"""The one configuration per stage: defaults agree with the constructors, types are checked,
to_dict/from_dict round-trip, and cheap changes keep the loaded model."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from funnel_core.config import (
    AttentionLMConfig,
    CrossEncoderConfig,
    ExtractiveCompressorConfig,
    FiDAttentionConfig,
    ForwardLookupConfig,
    GraphGranularityConfig,
    LaterChunkingConfig,
    MonoT5Config,
    MultiGranularityConfig,
    RankRAGConfig,
    RepackConfig,
    current_stage,
)

CONFIGS = [CrossEncoderConfig, MonoT5Config, FiDAttentionConfig, AttentionLMConfig,
           RankRAGConfig, LaterChunkingConfig, ExtractiveCompressorConfig, RepackConfig,
           ForwardLookupConfig, MultiGranularityConfig, GraphGranularityConfig]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.__name__)
def test_config_fields_are_constructor_arguments_with_equal_defaults(cfg):
    stage_cls = cfg.stage_class()
    params = inspect.signature(stage_cls.__init__).parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for f in dataclasses.fields(cfg):
        if f.name not in params:
            assert var_kw, f"{cfg.__name__}.{f.name} is not an argument of {stage_cls.__name__}"
            continue
        default = params[f.name].default
        if default is inspect.Parameter.empty:
            assert f.default is dataclasses.MISSING, f.name
        elif f.default is None and default is not None and isinstance(default, str):
            continue  # None in the config means "the constructor's default text"
        else:
            assert f.default == default, (cfg.__name__, f.name, f.default, default)


def test_config_type_errors_name_the_field():
    with pytest.raises(TypeError, match="CrossEncoderConfig.top_n must be an int"):
        CrossEncoderConfig(top_n="3")
    with pytest.raises(TypeError, match="batch_size"):
        CrossEncoderConfig(batch_size=True)


def test_stage_records_config_and_round_trips(tiny_cross_encoder_path):
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    s = CrossEncoderScorer(tiny_cross_encoder_path, top_n=3, normalize=True)
    assert s.config.top_n == 3 and s.config.normalize and s.config.model == str(tiny_cross_encoder_path)
    data = json.loads(json.dumps(s.to_dict()))
    back = CrossEncoderScorer.from_dict(data)
    assert back.config == s.config and back.top_n == 3
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['topn'\]"):
        CrossEncoderConfig.from_dict({**data, "topn": 1})


def test_cheap_change_keeps_loaded_model_model_change_does_not(tiny_cross_encoder_path, tmp_path):
    cfg = CrossEncoderConfig(model=str(tiny_cross_encoder_path), top_n=3)
    s1 = current_stage(cfg)
    s1.score("q", ["a text"])  # loads the model
    assert s1._model.loaded
    assert current_stage(cfg, s1) is s1
    s2 = current_stage(cfg.replace(top_n=1), s1)
    assert s2 is not s1 and s2.top_n == 1 and s2._model is s1._model
    s3 = current_stage(cfg.replace(backend="transformers"), s2)
    assert s3._model is not s1._model and not s3._model.loaded


def test_later_chunking_config():
    from funnel_core.funnelrag.chunking import LaterChunking

    lc = LaterChunking(words=7)
    assert lc.config == LaterChunkingConfig(words=7)
    assert LaterChunking.from_dict(lc.to_dict()).words == 7


def test_rankrag_config_does_not_serialise_llm_objects():
    cfg = RankRAGConfig(llm=object())
    data = cfg.to_dict()
    assert data["llm"] is None
    with pytest.raises(TypeError, match="llm="):
        RankRAGConfig.from_dict(data)
    with pytest.raises(TypeError, match="came back as a dict"):
        RankRAGConfig(llm={"class_name": "X"})
