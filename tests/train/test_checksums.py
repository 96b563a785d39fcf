"""Checkpoints verified: the state records the size and SHA-256 of every file; a damaged file stops a resume
(before anything loads) and a model load, naming the file, and the earlier checkpoint it names resumes."""

import hashlib

import pytest
from train_helpers import metrics, run_sft, sft_config

from barerl.formats.checksums import STATE_RECORD, ChecksumError
from barerl.model.model import Model
from barerl.train.state import STATE_DIR, STATE_FILE, load_training_state


def flip_a_bit(path, offset_from_end=100):
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def two_checkpoints(tmp_path):
    run_sft(sft_config(tmp_path, max_steps=4, save_steps=2))
    return tmp_path


def test_the_state_records_every_file_as_sha256sum_would(two_checkpoints):
    checkpoint = two_checkpoints / "checkpoint-4"
    recorded = load_training_state(checkpoint).checksums
    files = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
    assert set(recorded) == files - {STATE_RECORD}
    assert {"model.safetensors", "config.json", f"{STATE_DIR}/optimizer.safetensors"} <= set(recorded)
    weights = (checkpoint / "model.safetensors").read_bytes()
    assert recorded["model.safetensors"] == {"bytes": len(weights), "sha256": hashlib.sha256(weights).hexdigest()}
    assert f"{STATE_DIR}/{STATE_FILE}" == STATE_RECORD


def test_a_flipped_bit_in_the_weights_stops_the_resume_and_the_load(two_checkpoints):
    weights = two_checkpoints / "checkpoint-4" / "model.safetensors"
    flip_a_bit(weights)
    resume = sft_config(two_checkpoints, max_steps=6, resume_from_checkpoint="latest")
    with pytest.raises(ChecksumError, match=rf"{weights}: its contents changed since it was written .* the "
                                            r"checkpoint is damaged; an earlier one can be resumed instead: "
                                            rf"--resume_from_checkpoint {two_checkpoints / 'checkpoint-2'} "
                                            r"--overwrite_output_dir true"):
        run_sft(resume)
    with pytest.raises(ChecksumError, match=f"{weights}: its contents changed"):
        Model.from_pretrained(weights.parent)
    assert [r["step"] for r in metrics(two_checkpoints)] == [1, 2, 3, 4]  # nothing was touched
    # the earlier checkpoint it names resumes, and the damaged one is replaced by a sound one
    run_sft(sft_config(two_checkpoints, max_steps=4, resume_from_checkpoint=str(two_checkpoints / "checkpoint-2"),
                       overwrite_output_dir=True))
    assert Model.from_pretrained(weights.parent).params.flat.size


def test_damaged_optimizer_state_stops_the_resume(two_checkpoints):
    optimizer = two_checkpoints / "checkpoint-4" / STATE_DIR / "optimizer.safetensors"
    flip_a_bit(optimizer, offset_from_end=7)
    with pytest.raises(ChecksumError, match=f"{optimizer}: its contents changed"):
        run_sft(sft_config(two_checkpoints, max_steps=6, resume_from_checkpoint="latest"))
    Model.from_pretrained(optimizer.parent.parent)  # the model itself is sound and loads


def test_truncated_and_missing_files_are_named(two_checkpoints):
    checkpoint = two_checkpoints / "checkpoint-4"
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(ChecksumError, match=rf"{weights}: \d+ bytes where \d+ were written \(truncated or replaced\)"):
        Model.from_pretrained(checkpoint)
    (checkpoint / "config.json").unlink()
    with pytest.raises(ChecksumError, match=f"{checkpoint / 'config.json'}: missing; .*state.json lists it"):
        Model.from_pretrained(checkpoint)
