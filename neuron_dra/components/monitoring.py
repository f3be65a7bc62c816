"""`podMonitor: auto`: does the existing cluster serve prometheus-operator's PodMonitor CRD?

Pulumi cannot branch on what a cluster holds at plan time (a resource's outputs are known only after it is
created), so the program asks the cluster itself, once, while it runs: a GET of the CRD through the stack's
kubeconfig. A cluster this stack creates does not exist yet and gets no prometheus-operator from it, so auto
means off there. An unreachable cluster or a refused GET is logged and also means off: `pulumi up` then fails
nowhere, and `podMonitor: true` forces the object.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

POD_MONITOR_CRD = "podmonitors.monitoring.coreos.com"
LOOKUP_TIMEOUT_SECONDS = 10.0

Warn = Callable[[str], None]


def serves_pod_monitors(kubeconfig: str, warn: Warn) -> bool:
    """True when the cluster of `kubeconfig` (its contents or a path) has the PodMonitor CRD."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    try:
        text = Path(kubeconfig).expanduser().read_text() if "\n" not in kubeconfig else kubeconfig
        api = config.new_client_from_config_dict(yaml.safe_load(text))
    except Exception as e:  # a kubeconfig the provider may still accept: say why auto is off
        warn(f"podMonitor auto: cannot read the kubeconfig ({type(e).__name__}: {str(e)[:200]}); no PodMonitor")
        return False
    try:
        client.ApiextensionsV1Api(api).read_custom_resource_definition(
            POD_MONITOR_CRD, _request_timeout=LOOKUP_TIMEOUT_SECONDS)
        return True
    except ApiException as e:
        if e.status != 404:
            warn(f"podMonitor auto: reading CRD {POD_MONITOR_CRD} failed (HTTP {e.status}); no PodMonitor")
        return False
    except Exception as e:
        warn(f"podMonitor auto: the cluster did not answer ({type(e).__name__}: {str(e)[:200]}); no PodMonitor")
        return False
    finally:
        api.close()
