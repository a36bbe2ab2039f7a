"""cub's look-back temporaries (predict/emulate/cub.py), worked out by hand from cub's dispatch code: one 16-byte
tile state per tile and 32 more, rounded up to 256 bytes, aliased once (CCCL 2) or twice (CCCL 3)."""

from __future__ import annotations

import pytest
import torch

from membench.predict import gpus
from membench.predict.emulate.cub import cub_exclusive_sum_temp_bytes, cub_unique_by_key_temp_bytes

H200, A100, T4 = gpus.gpu("H200"), gpus.gpu("A100"), gpus.gpu("T4")


@pytest.fixture
def cuda_13(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")


def test_the_h200_traces_sizes(cuda_13):
    # 4,096 and 8,192 items: the scan's 896-item tiles 5 and 10, unique_by_key's 4,480-item ones 1 and 2; in every
    # case 16 x (32 + tiles) B of tile states rounds up to 768, + 256 + 255
    for n in (4096, 8192):
        assert cub_exclusive_sum_temp_bytes(n) == 1279
        assert cub_unique_by_key_temp_bytes(n, H200) == 1279


def test_more_tiles_take_more_and_each_architecture_its_own_tile(cuda_13):
    assert cub_exclusive_sum_temp_bytes(65_536) == 1792 + 511  # 74 tiles: 16 x 106 = 1,696 -> 1,792
    assert cub_unique_by_key_temp_bytes(65_536, A100) == 1280 + 511  # sm80's 1,792: 37 tiles, 1,104 -> 1,280
    assert cub_unique_by_key_temp_bytes(8192, T4) == 1024 + 511  # the default's 320: 26 tiles, 928 -> 1,024
    assert cub_unique_by_key_temp_bytes(1_048_576, H200) == 4352 + 511  # 235 tiles: 4,272 -> 4,352


def test_cccl_2_aliases_its_tile_states_once(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert cub_exclusive_sum_temp_bytes(8192) == 768 + 255  # 10 tiles: 672 -> 768
    assert cub_unique_by_key_temp_bytes(1_048_576, H200) == 4352 + 255
