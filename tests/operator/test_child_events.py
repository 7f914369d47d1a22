"""What a child's watch event asks of its service (``child_action``), event by event."""

from __future__ import annotations

import pytest

from strata.operator.child_events import child_action


@pytest.mark.parametrize("plural", ["deployments", "statefulsets", "services", "configmaps"])
def test_a_listing_of_a_child_this_process_never_applied_waits_for_the_service(plural):
    assert child_action(None, plural, own=False, known=False, status_only=True) == "ignore"


@pytest.mark.parametrize("plural", ["deployments", "statefulsets"])
def test_a_relisted_workload_as_we_applied_it_refreshes_the_status_it_may_have_missed(plural):
    """After a watch outage (410 Gone) the relist is the only news of a rollout that moved
    meanwhile: the spec is ours, so no reconcile, but the service's status is refreshed."""
    assert child_action(None, plural, own=True, known=True, status_only=True) == "refresh"
    assert child_action(None, plural, own=True, known=True, status_only=False) == "refresh"


def test_a_relisted_child_without_a_rollout_as_we_applied_it_is_left_alone():
    assert child_action(None, "configmaps", own=True, known=True, status_only=False) == "ignore"


@pytest.mark.parametrize("plural", ["deployments", "configmaps"])
def test_a_relisted_child_changed_by_someone_else_is_reconciled(plural):
    assert child_action(None, plural, own=False, known=True, status_only=False) == "reconcile"


def test_a_workload_whose_rollout_moved_refreshes_the_status():
    assert child_action("MODIFIED", "deployments", own=True, known=True, status_only=True) == "refresh"


def test_the_echo_of_our_own_apply_is_ignored():
    assert child_action("MODIFIED", "deployments", own=True, known=True, status_only=False) == "ignore"
    assert child_action("ADDED", "services", own=True, known=True, status_only=False) == "ignore"


def test_a_child_edited_by_hand_or_deleted_is_reconciled():
    assert child_action("MODIFIED", "services", own=False, known=True, status_only=False) == "reconcile"
    assert child_action("DELETED", "deployments", own=True, known=True, status_only=True) == "reconcile"
