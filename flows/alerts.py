"""The nightly's alert: `nightly.yaml`'s webhook, wired by `alignflow serve` into Prefect's own machinery.

`serve` saves a notification block (`alignflow-nightly-alert`: Prefect's Slack or Microsoft Teams webhook block,
or its custom webhook block posting `{"subject": ..., "text": ...}` for any other URL) and an automation that
sends it whenever a `nightly-regression` flow run ends Failed or Crashed. The nightly's Failed state names the
experiments that regressed and why (`flows.summaries.nightly_message`), so that message is the alert's text,
with a link to the run. Both objects are visible and editable in the UI (Blocks, Automations); `serve` replaces
them on every start, and removes them when `nightly.yaml` names no alert. Notifications go through automations
since Prefect 3.4 (https://docs.prefect.io/v3/automate/events/automations-triggers).

The events a flow run's state change emits are named after the state *name* (`prefect.flow-run.Regressed`), so
the trigger matches every flow-run event and filters on the state *type* label, which named states keep.
"""

import logging
from typing import TYPE_CHECKING, cast
from uuid import UUID

from alignflow.config.catalog import NightlyAlert

if TYPE_CHECKING:
    from prefect.blocks.abstract import NotificationBlock
    from prefect.events.schemas.automations import EventTrigger

log = logging.getLogger(__name__)

BLOCK_NAME = "alignflow-nightly-alert"
AUTOMATION_NAME = "alignflow: nightly regression alert"
NIGHTLY_FLOW = "nightly-regression"
SUBJECT = "alignflow {{ flow_run.name }}: {{ flow_run.state.name }}"
BODY = "{{ flow_run.state.message }}\n{{ flow_run|ui_url }}"


def notification_block(alert: NightlyAlert) -> "NotificationBlock":
    """Prefect's notification block for the alert's format (Slack and Teams send those services' own payloads,
    through apprise; `json` posts `{"subject", "text"}` to any URL)."""
    from prefect.blocks.notifications import (
        CustomWebhookNotificationBlock,
        MicrosoftTeamsWebhook,
        SlackWebhook,
    )
    from pydantic import SecretStr

    url = alert.url()
    if alert.format == "slack":
        return SlackWebhook(url=SecretStr(url))
    if alert.format == "teams":
        return MicrosoftTeamsWebhook(url=SecretStr(url))
    return CustomWebhookNotificationBlock(name="alignflow nightly", url=url,
                                          json_data={"subject": "{{subject}}", "text": "{{body}}"})


def nightly_trigger() -> "EventTrigger":
    """Any flow run of the nightly flow entering a Failed- or Crashed-type state (named ones included)."""
    from prefect.events.schemas.automations import EventTrigger, Posture

    return EventTrigger(
        expect={"prefect.flow-run.*"},
        match={"prefect.resource.id": "prefect.flow-run.*", "prefect.state-type": ["FAILED", "CRASHED"]},
        match_related={"prefect.resource.role": "flow", "prefect.resource.name": NIGHTLY_FLOW},
        posture=Posture.Reactive, threshold=1)


def install_alert(alert: NightlyAlert | None) -> UUID | None:
    """Save the block and (re)create the automation; with no alert, remove both. Returns the automation's id."""
    from prefect.automations import Automation
    from prefect.events.actions import SendNotification

    _remove_automations()
    if alert is None:
        _remove_block()
        return None
    block_id = notification_block(alert).save(BLOCK_NAME, overwrite=True)
    automation = cast(Automation, Automation(
        name=AUTOMATION_NAME, description="Created by `alignflow serve` from nightly.yaml's `alert`; replaced on "
                                          "every start.",
        trigger=nightly_trigger(),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)],
    ).create())  # the sync twin (outside an event loop), not a coroutine
    log.info("nightly alert: %s webhook, automation %s", alert.format, automation.id)
    return UUID(str(automation.id))


def _remove_automations() -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for automation in client.read_automations_by_name(AUTOMATION_NAME):
            client.delete_automation(automation.id)


def _remove_block() -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for slug in ("slack-webhook", "ms-teams-webhook", "custom-webhook"):
            try:
                doc = client.read_block_document_by_name(BLOCK_NAME, block_type_slug=slug)
            except ObjectNotFound:
                continue
            client.delete_block_document(doc.id)
