"""The README's client example runs as written, against the real broker, Redis and a worker.

The example is the fenced ``python`` block after the ``<!-- readme-test -->`` marker in README.md.
It is executed unchanged, except that ``Settings.from_env()`` returns the session's settings
(the services the other integration tests use), so the integration section cannot drift from
the client's API or the event contracts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from leap.core.settings import Settings
from leap.services.workers import WorkerProcess

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- readme-test -->"


def readme_examples(text: str) -> list[str]:
    """Every fenced python block that directly follows the marker, in order."""
    return re.findall(re.escape(MARKER) + r"\s*```python\n(.*?)```", text, flags=re.S)


def test_the_readme_has_one_marked_example() -> None:
    examples = readme_examples(README.read_text())
    assert len(examples) == 1
    assert "SchedulerClient" in examples[0] and "wait_for" in examples[0]


@pytest.mark.integration
@pytest.mark.e2e
def test_the_readme_client_example_publishes_and_reads_its_ranking(
    worker: WorkerProcess, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(Settings, "from_env", staticmethod(lambda: settings))
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(readme_examples(README.read_text())[0], str(README), "exec"), namespace)

    ranking, submission = namespace["ranking"], namespace["submission"]
    assert ranking.attempt_id == submission.attempt_id
    assert {c["hardware"] for c in ranking.candidates} == set(submission.candidates)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(submission.candidates)
    assert printed[0].split()[:2] == ["1", ranking.best_hardware]
