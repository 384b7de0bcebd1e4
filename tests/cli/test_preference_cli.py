"""``blackwell-training validate`` and ``plan`` of a preference tuning request, offline on local copies of its
folders (``--init-from``, ``--data-folder``), with the objective named in the execution input's hyperparameters
(``--set hyperparameters.objective=dpo``): the plan says where the reference comes from and what it costs; an
objective the data cannot train is refused with exit 2 before anything starts."""

from __future__ import annotations

import json

from tests.cli.test_plan_offline import project, run  # noqa: F401 - the fixture
from tests.request.test_fine_tuning_request import MODEL
from tests.request.test_preference_request import CHATS, PAIRS, folders  # noqa: F401 - the fixture


def test_plan_and_validate_of_a_dpo_request_on_local_copies(project, folders, capsys):  # noqa: F811
    (project / "run.json").write_text(json.dumps({"init_from": MODEL, "train_data_uri": PAIRS, "seq_length": 512,
                                                  "batch_size": 1, "hyperparameters": {"max_steps": "100"}}))  # fmt: skip
    local = ["--init-from", str(folders["model"]), "--data-folder", str(folders[PAIRS])]
    status, out, err = run(capsys, "plan", "run.json", *local, "--set", "hyperparameters.objective=dpo")
    assert status == 0, err
    assert "preference tuning (dpo): reference precomputed: one forward of the initial model over " in out
    assert "training pairs in" in out
    planned = json.loads(
        run(capsys, "plan", "run.json", *local, "--set", "hyperparameters.lora_rank=8", "--json")[1]
    )
    assert planned["preference"]["reference"] == "adapter_off" and planned["preference"]["step_factor"] > 1.3
    status, _, err = run(
        capsys, "validate", "run.json", *local, "--set", "hyperparameters.objective=next_token"
    )
    assert status == 2 and "hyperparameters.objective: next_token cannot train on preference data" in err
    status, out, err = run(capsys, "validate", "run.json", *local, "--set", "hyperparameters.objective=dpo")
    assert status == 0, err
