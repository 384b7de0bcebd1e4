"""The pages, read once per test process."""

from __future__ import annotations

import pytest

from tests.docs.pages import Page, all_pages


@pytest.fixture(scope="session")
def pages() -> list[Page]:
    return all_pages()
