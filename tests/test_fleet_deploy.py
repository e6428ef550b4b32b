"""What `serve --ray` says when Ray Serve gives up on a deployment (edgeinfer/fleet/ray_serve.py): each
deployment that is not up, with the last line of Serve's message, from Serve's own status classes."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")


def overview(status: str, message: str):
    from ray.serve._private.common import DeploymentStatus, DeploymentStatusTrigger
    from ray.serve.schema import DeploymentStatusOverview

    return DeploymentStatusOverview(status=DeploymentStatus(status),
                                    status_trigger=DeploymentStatusTrigger.CONFIG_UPDATE_STARTED,
                                    replica_states={}, message=message)


def test_each_deployment_not_up_is_named_with_the_last_line_of_its_message():
    from edgeinfer.fleet.ray_serve import not_deployed

    deployments = {
        "router": overview("HEALTHY", ""),
        "bundle-reranker": overview("DEPLOY_FAILED", "A replica failed to start with exception. Retrying 0 more "
                                    "time(s). Error:\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                                    "edgeinfer.errors.InputError: bundle /b is not the one `edgeinfer serve` was "
                                    "started with\n\n"),
        "bundle-classifier": overview("UPSCALING", "scaling up"),
        "bundle-minilm": overview("UNHEALTHY", ""),
    }
    assert not_deployed(deployments) == (
        "bundle-reranker (edgeinfer.errors.InputError: bundle /b is not the one `edgeinfer serve` was started with)"
        ", bundle-minilm (UNHEALTHY)")


def test_with_no_status_the_application_is_named():
    from edgeinfer.fleet.ray_serve import not_deployed

    assert not_deployed({}) == "the application"
