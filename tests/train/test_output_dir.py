"""One run per output folder: a new run refuses a folder in use (and loses nothing of it), overwrite_output_dir
leaves nothing of the old run, a resume names its checkpoint and the settings that changed, and refuses the
changes that would make it meaningless."""

import hashlib

import pytest
from train_helpers import grpo_config, metrics, run_grpo, run_sft, sft_config

from barerl.train.output_dir import prepare_output_dir


def contents(folder) -> dict[str, str]:
    """Every file under folder, by relative path, with a hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def checkpoint_steps(folder) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*"))


def test_a_new_run_into_a_folder_in_use_is_refused_and_loses_nothing(tmp_path):
    run_sft(sft_config(tmp_path))
    before = contents(tmp_path)
    with pytest.raises(ValueError, match=r"is not empty \(checkpoint-2, checkpoint-4, .*--resume.*"
                                         r"--overwrite_output_dir true"):
        run_sft(sft_config(tmp_path, max_steps=2))
    assert contents(tmp_path) == before


def test_overwrite_output_dir_leaves_nothing_of_the_old_run(tmp_path, capsys):
    run_sft(sft_config(tmp_path, max_steps=6))
    (tmp_path / "notes.txt").write_text("the user's own")
    run_sft(sft_config(tmp_path, max_steps=2, overwrite_output_dir=True))
    assert "left alone: notes.txt" in capsys.readouterr().err
    assert checkpoint_steps(tmp_path) == [2]
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2]
    assert (tmp_path / "notes.txt").read_text() == "the user's own"
    # and a resume continues the new run, not the old run's checkpoint-6
    assert prepare_output_dir(sft_config(tmp_path, resume_from_checkpoint="latest")) == tmp_path / "checkpoint-2"


def test_a_resume_names_its_checkpoint_and_what_changed(tmp_path, capsys):
    run_sft(sft_config(tmp_path, max_steps=2))
    capsys.readouterr()
    run_sft(sft_config(tmp_path, max_steps=4, learning_rate=2e-2, resume_from_checkpoint="latest"))
    err = capsys.readouterr().err
    assert f"resuming from {tmp_path / 'checkpoint-2'} (step 2)" in err
    assert "settings changed since checkpoint-2: learning_rate 0.01 -> 0.02, max_steps 2 -> 4" in err
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2, 3, 4]


def test_a_resume_with_nothing_to_resume_says_so(tmp_path, capsys):
    assert prepare_output_dir(sft_config(tmp_path / "new", resume_from_checkpoint="latest")) is None
    assert "holds no complete checkpoint yet; starting from step 0" in capsys.readouterr().err


@pytest.mark.parametrize("change, shown", [
    ({"num_generations": 4}, "num_generations: 8 -> 4"),
    ({"seed": 4}, "seed: 3 -> 4"),
    ({"model": "another/model"}, "model: None -> 'another/model'"),
])
def test_a_resume_that_would_be_meaningless_is_refused(tmp_path, change, shown):
    run_grpo(grpo_config(tmp_path, max_steps=1, save_steps=1))
    with pytest.raises(ValueError, match=rf"trained with other settings \({shown}\); resuming it with these "
                                         "would be meaningless"):
        prepare_output_dir(grpo_config(tmp_path, resume_from_checkpoint="latest", **change))


def test_resuming_an_older_checkpoint_than_the_newest_is_refused(tmp_path, capsys):
    run_sft(sft_config(tmp_path))
    older = str(tmp_path / "checkpoint-2")
    with pytest.raises(ValueError, match="holds checkpoint-4, newer than .*checkpoint-2 .*a later --resume would "
                                         "load them"):
        prepare_output_dir(sft_config(tmp_path, resume_from_checkpoint=older))
    assert checkpoint_steps(tmp_path) == [2, 4]
    assert prepare_output_dir(sft_config(tmp_path, resume_from_checkpoint=older, overwrite_output_dir=True))
    assert checkpoint_steps(tmp_path) == [2]
