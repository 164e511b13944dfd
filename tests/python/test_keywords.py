"""From Python, hetseq's errors and log lines name the keyword the user passed (shared_memory="on", bucket_cap_mb,
timeout_s, batch_sizes, ...), never hetseq-train's flag for it (--shared-memory-reduce, --bucket-cap-mb,
--distributed-timeout, --max-sentences, ...), and advise what a Python user can do (Note [Options in the user's
words], hetseq/core/option_names.h). hetseq-train's own messages, with the flags, are checked by the C++ tests."""
import json
import os
import re
import sys

import pytest

import hetseq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ranks import torchrun  # noqa: E402

WORKER = os.path.join(HERE, "keywords_worker.py")
FLAG = re.compile(r"--[a-z][a-z-]+")  # a command-line flag


def no_flag(text):
    assert not FLAG.search(text), f"names a flag ({FLAG.search(text).group()}): {text}"
    return text


def error_of(fn, kind):
    with pytest.raises(kind) as e:
        fn()
    return no_flag(str(e.value))


def test_a_plan_names_its_arguments():
    assert error_of(lambda: hetseq.data.Plan(10, [0, 4]), hetseq.UsageError).startswith(
        "batch_sizes: rank 0 has batch size 0")
    assert error_of(lambda: hetseq.data.Plan(10, [3, 4], [1, 0]), hetseq.UsageError).startswith(
        "update_freqs: rank 1 has update frequency 0")
    text = error_of(lambda: hetseq.data.Plan(10, [3, 4], [1]), hetseq.UsageError)
    assert "2 batch sizes (batch_sizes) for 1 update frequencies (update_freqs); give one value per rank" in text
    assert "one for all" not in text  # hetseq-train's --update-freq takes one value for all ranks; Plan does not
    assert error_of(lambda: hetseq.data.Plan(0, [3]), hetseq.InputError).endswith("check dataset_size")
    text = error_of(lambda: hetseq.data.Plan(10, [3, 4]).restore(1, 11), hetseq.InputError)
    assert "the dataset has 10 samples" in text and "Leave plan= out of hetseq.checkpoint.load" in text


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("keywords")
    stderr = torchrun(2, WORKER, out, "plain", timeout=180)
    return [json.loads((out / f"plain{r}.json").read_text()) for r in range(2)], stderr


def test_shared_memory_of_another_value_names_the_keyword(plain):
    for found in plain[0]:
        assert no_flag(found["shared_memory_value"]) == (
            'UsageError: shared_memory: "yes" is not one of "auto", "on", "off"')


def test_bucket_cap_mb_of_zero_is_a_usage_error_naming_the_keyword(plain):
    for found in plain[0]:
        assert no_flag(found["bucket_cap_mb"]) == "UsageError: bucket_cap_mb: 0 is not a positive number of MiB"


def test_a_parameter_without_a_gradient_is_explained_without_find_unused_parameters(plain):
    # hetseq-train says "Use --find-unused-parameters"; DistributedDataParallel has no such keyword.
    for found in plain[0]:
        text = no_flag(found["unused_parameter"])
        assert text.startswith("InputError: ") and "parameters without any gradient: [unused.weight, unused.bias]" in text
        assert "has no find_unused_parameters" in text and "requires_grad=False" in text


def test_the_shared_memory_log_line_names_the_keyword(plain):
    lines = [line for line in plain[1].splitlines() if "sum their gradients through shared memory" in line]
    assert lines, plain[1][-4000:]
    for line in lines:
        no_flag(line)
        assert "(shared_memory; " in line, line


def test_a_peer_late_past_timeout_s_names_the_keyword(plain):
    text = no_flag(plain[0][0]["shared_memory_timeout"])
    assert text.startswith("PeerError: ") and "did not reach it within timeout_s (1 s)" in text, text


def test_a_checkpoint_of_another_dataset_says_what_to_do_from_python(plain):
    for found in plain[0]:
        text = no_flag(found["checkpoint_plan"])
        assert text.startswith("InputError: cannot restore the data position (epoch 1, offset 42)"), text
        assert "Leave plan= out of hetseq.checkpoint.load" in text, text


def test_shared_memory_on_with_a_checked_group_names_the_keyword_and_the_variable(tmp_path):
    # From Python, hetseq-train's --debug-collectives is TORCH_DISTRIBUTED_DEBUG=DETAIL: the group then checks
    # every collective, and the buckets stay on it (Note [Shared memory and --debug-collectives]).
    stderr = torchrun(2, WORKER, tmp_path, "checked", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, timeout=180)
    for r in range(2):
        found = json.loads((tmp_path / f"checked{r}.json").read_text())
        text = no_flag(found["shared_memory_on"])
        assert text.startswith('UsageError: shared_memory="on" cannot be combined with TORCH_DISTRIBUTED_DEBUG=DETAIL'), text
        assert 'pass shared_memory="auto" or "off"' in text, text
        assert found["shared_memory_auto"] == "NO_ERROR"
    lines = [line for line in stderr.splitlines() if "[reducer] TORCH_DISTRIBUTED_DEBUG=DETAIL" in line]
    assert lines, stderr[-4000:]
    assert all('(shared_memory="auto")' in no_flag(line) for line in lines), lines
