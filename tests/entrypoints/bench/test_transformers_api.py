"""The generate_batch baseline's keywords follow the installed transformers' continuous batching
config, whatever its version calls the page size."""

import dataclasses

import pytest

from pagedgen.entrypoints.bench.engines import page_size_keyword


@dataclasses.dataclass
class BlockSizeOnly:
    block_size: int = 256
    num_blocks: int | None = None


@dataclasses.dataclass
class PageSizeAndDeprecatedBlockSize:
    page_size: int = 256
    num_blocks: int | None = None
    block_size: int | None = None


class PageSizeInit:
    def __init__(self, page_size: int = 256, num_blocks: int | None = None) -> None:
        self.page_size = page_size


class NeitherInit:
    def __init__(self, num_blocks: int | None = None) -> None:
        pass


def test_the_installed_config_takes_the_chosen_keyword():
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    keyword = page_size_keyword(ContinuousBatchingConfig)
    names = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    assert keyword == ("page_size" if "page_size" in names else "block_size")
    config = ContinuousBatchingConfig(**{keyword: 64}, num_blocks=3)
    assert getattr(config, "page_size", None) == 64 or config.block_size == 64


@pytest.mark.parametrize(
    ("config_class", "keyword"),
    [
        (BlockSizeOnly, "block_size"),
        (PageSizeAndDeprecatedBlockSize, "page_size"),
        (PageSizeInit, "page_size"),
    ],
)
def test_stand_in_configs_of_each_shape(config_class, keyword):
    assert page_size_keyword(config_class) == keyword
    config_class(**{keyword: 64})


def test_a_config_without_a_page_size_is_refused_by_name():
    with pytest.raises(RuntimeError, match="NeitherInit takes neither page_size nor block_size"):
        page_size_keyword(NeitherInit)
