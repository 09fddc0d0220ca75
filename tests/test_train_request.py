"""engine.train.driver: one validated request object and a run in named stages (issue 18)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cli.main import cli_words
from engine.core.errors import InputError
from tests.helpers.voices import voice_with_clips


@pytest.mark.parametrize("options,message", [
    ({"workers": 0}, "--workers must be at least 1, not 0."),
    ({"keep_checkpoints": 1}, "--keep must be at least 2, not 1."),
    ({"lr": 0.0}, "--lr must be above 0, not 0."),
    ({"predictor_frames": 1.5}, "--predictor-frames must be above 0 and at most 1, not 1.5."),
    ({"precision": "fp8"}, "--precision must be one of auto, bf16, fp16, fp32, not 'fp8'."),
    ({"trainable": "everything"}, "--trainable must be one of talker, talker+text, "
                                  "code_predictor, talker_layers, lora, not 'everything'."),
])
def test_a_bad_request_fails_in_one_sentence_before_anything(options: dict, message: str
                                                             ) -> None:
    from engine.train.driver import train
    from engine.train.request import TrainRequest

    # a voice that does not exist: validation comes first, nothing is opened
    with pytest.raises(InputError) as err:
        train("/nonexistent/voice", "some-base", dry_run=True, **options)
    # the error names the setting as data; the CLI words it as its flag
    (name,) = options
    assert err.value.settings[0].endswith("." + name)
    assert err.value.worded(cli_words)[0] == message
    # the Python API's words: the keyword
    assert err.value.message.startswith(name + " must be ")
    with pytest.raises(InputError):
        TrainRequest.of("/nonexistent/voice", "some-base", **options).validated()


def test_the_run_goes_through_its_stages(tmp_path: Path, tiny_model_dir: Path) -> None:
    from engine.train.driver import train
    from engine.train.request import TrainRequest
    from engine.train.run import TrainRun

    voice = voice_with_clips(tmp_path, 12, 4.0)
    request = TrainRequest.of(voice, str(tiny_model_dir), workers=2, steps=5, use_gpu=False,
                              dry_run=True)
    run = TrainRun(request)
    cfg = run.resolve()
    assert cfg.parallel.workers == 2 and cfg.run.steps == 5
    assert run.run_dir.parent == run.voice.runs_dir and not run.run_dir.exists()
    plan = run.plan()
    assert plan.workers == 2 and plan.device == "cpu" and plan.fits
    # the same request through the function every caller uses gives the same result
    again = train(voice, str(tiny_model_dir), workers=2, steps=5, use_gpu=False, dry_run=True)
    staged = TrainRun(request).start()
    assert again["config"] == staged["config"]
    # host memory available moves between calls; what the run needs does not
    assert again["plan"]["total"] == staged["plan"]["total"] == plan.total
