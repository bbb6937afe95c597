"""On XPU, EAGLE-family speculative decoding refuses the sampling-verify flags it
would ignore, and says at startup that it verifies drafts greedily."""

import logging
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import device_memory_mb  # noqa: E402

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

# Pin every fact resolution reads so a Blackwell or ROCm runner answers the same
# (ROCm turns rejection sampling on by itself).
NOT_BLACKWELL_OR_ROCM = dict(is_sm100=False, is_sm120=False, is_hip=False)

# A model folder needs only a config.json: no weights, no tokenizer. The draft is
# the same tiny model.
TINY_CONFIG = Path(__file__).resolve().parents[1] / "tiny_qwen3_config.json"

GREEDY_NOTICE = "verifies drafts greedily"


class _Resolution(CustomTestCase):
    """`ServerArgs(...).resolve_once()`, the entry point every release keeps."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        shutil.copy(TINY_CONFIG, f"{cls._tmp.name}/config.json")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _resolve(self, device: str, algorithm: str = "EAGLE", **fields):
        args = ServerArgs(
            model_path=self._tmp.name,
            device=device,
            speculative_algorithm=algorithm,
            speculative_draft_model_path=self._tmp.name,
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            **fields,
        )
        with override_platform(**NOT_BLACKWELL_OR_ROCM), device_memory_mb(24576):
            args.resolve_once()
        return resolved_view(args)


class TestSpeculativeSamplingFlagsOnXpu(_Resolution):
    def test_rejection_sampling_is_refused_naming_the_flag(self):
        with self.assertRaises(ValueError) as ctx:
            self._resolve("xpu", speculative_use_rejection_sampling=True)
        message = str(ctx.exception)
        self.assertIn("--speculative-use-rejection-sampling", message)
        self.assertIn("XPU", message)
        self.assertIn("greedily", message)

    def test_each_accept_threshold_is_refused_naming_the_flags(self):
        for field in (
            "speculative_accept_threshold_single",
            "speculative_accept_threshold_acc",
        ):
            with self.subTest(field=field):
                with self.assertRaises(ValueError) as ctx:
                    self._resolve("xpu", **{field: 0.5})
                message = str(ctx.exception)
                self.assertIn("--speculative-accept-threshold-single", message)
                self.assertIn("--speculative-accept-threshold-acc", message)
                self.assertIn("XPU", message)

    def test_every_eagle_family_algorithm_is_covered(self):
        for algorithm in ("EAGLE", "STANDALONE"):
            with self.subTest(algorithm=algorithm):
                with self.assertRaises(ValueError) as ctx:
                    self._resolve(
                        "xpu", algorithm, speculative_use_rejection_sampling=True
                    )
                self.assertIn("not supported on XPU", str(ctx.exception))

    def test_a_plain_eagle_server_starts_and_says_it_decodes_greedily(self):
        with self.assertLogs(level=logging.WARNING) as logs:
            view = self._resolve("xpu")
        self.assertEqual(view.speculative_algorithm, "EAGLE")
        self.assertFalse(view.speculative_use_rejection_sampling)
        notices = [line for line in logs.output if GREEDY_NOTICE in line]
        self.assertEqual(len(notices), 1, logs.output)
        self.assertIn("temperature 0", notices[0])


class TestSpeculativeSamplingFlagsOnCuda(_Resolution):
    """CUDA has the sampling-verify kernels: the flags stay, and nothing warns."""

    def test_rejection_sampling_is_kept(self):
        view = self._resolve("cuda", speculative_use_rejection_sampling=True)
        self.assertTrue(view.speculative_use_rejection_sampling)

    def test_accept_thresholds_are_kept(self):
        view = self._resolve("cuda", speculative_accept_threshold_single=0.5)
        self.assertEqual(view.speculative_accept_threshold_single, 0.5)

    def test_no_greedy_notice(self):
        with self.assertLogs(level=logging.WARNING) as logs:
            self._resolve("cuda")
        self.assertFalse(
            [line for line in logs.output if GREEDY_NOTICE in line], logs.output
        )


if __name__ == "__main__":
    unittest.main()
