"""An unset decode retraction backup degrades to cpu_tensor on a resolved XPU."""

import importlib.util
import sys
import unittest
from pathlib import Path
from unittest import mock

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.mem_cache import kv_cache_builder
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.runtime_context import get_context, get_disagg
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import standin  # noqa: E402

register_cpu_ci(est_time=12, suite="base-a-test-cpu")

# See test_xpu_host_pool_rejection.py: from 0.5.23 upstream binds XPU movers and
# picks host_pool on XPU too; 0004 is retired there.
XPU_MOVERS = "sglang.srt.mem_cache.pool_host._kvcacheio"
SUPERSEDED = importlib.util.find_spec(XPU_MOVERS) is not None


def _tp_worker() -> TpModelWorker:
    """A decode worker whose KV pool is a plain MHA pool (host-pool capable),
    built from the real classes with only these facts set."""
    pool = standin(MHATokenToKVPool)
    allocator = standin(object, get_kvcache=lambda: pool)
    runner = standin(ModelRunner, model_config=standin(ModelConfig))
    return standin(
        TpModelWorker,
        get_memory_pool=lambda: (None, allocator),
        is_hybrid_swa=False,
        model_runner=runner,
    )


@unittest.skipIf(
    SUPERSEDED,
    f"this sglang gives XPU its own host-pool page movers ({XPU_MOVERS}) and "
    "picks host_pool there: 0004 is retired here",
)
class TestDecodeRetractionBackupOnXpu(CustomTestCase):
    def _resolve(self, device: str) -> tuple[str, str]:
        with (
            # hicache_ratio is given so only the backend choice is resolved.
            get_context().override_server_args(
                device=device, disaggregation_mode="decode", hicache_ratio=2.0
            ),
            # Pin the hardware probe (a ROCm runner would say True) and the model
            # fact the stand-in config cannot answer.
            mock.patch.object(kv_cache_builder, "is_hip", return_value=False),
            mock.patch.object(kv_cache_builder, "uses_ssm_state", return_value=False),
        ):
            returned = kv_cache_builder.resolve_decode_retraction_backup(
                tp_worker=_tp_worker()
            )
            return returned, get_disagg().disaggregation_decode_retraction_backup

    def test_xpu_degrades_to_cpu_tensor(self):
        self.assertEqual(self._resolve("xpu"), ("cpu_tensor", "cpu_tensor"))

    def test_cuda_keeps_host_pool(self):
        self.assertEqual(self._resolve("cuda"), ("host_pool", "host_pool"))

    def test_cpu_device_keeps_todays_choice(self):
        # Keyed on the resolved device: only "xpu" changes.
        self.assertEqual(self._resolve("cpu")[0], "host_pool")


if __name__ == "__main__":
    unittest.main()
