"""The driver's deployment: its options and its Kubernetes objects as plain dicts, for every way of installing it.

`options` holds `DriverDeployOptions` (what varies between installations, each value checked once) and
`manifests` renders the objects from them (`manifests(options)`, in apply order). The Pulumi `NeuronDraDriver`
component applies exactly these dicts, `neuron-dra plan -o yaml` prints them and the local cluster applies them.
`dashboard` (the Grafana dashboard) and `monitoring` (metrics discovery objects) are their own modules. No Pulumi
import here: the driver image must not need it.
"""

from __future__ import annotations

from neuron_dra.driver.deploy.manifests import (
    CATALOG_DIR as CATALOG_DIR,
)
from neuron_dra.driver.deploy.manifests import (
    CATALOG_KEY as CATALOG_KEY,
)
from neuron_dra.driver.deploy.manifests import (
    COMPUTE_TYPE_LABEL as COMPUTE_TYPE_LABEL,
)
from neuron_dra.driver.deploy.manifests import (
    EXCLUDED_COMPUTE_TYPES as EXCLUDED_COMPUTE_TYPES,
)
from neuron_dra.driver.deploy.manifests import (
    HOST_READ_ONLY_PATHS as HOST_READ_ONLY_PATHS,
)
from neuron_dra.driver.deploy.manifests import (
    INSTANCE_TYPE_LABEL as INSTANCE_TYPE_LABEL,
)
from neuron_dra.driver.deploy.manifests import (
    LNC_CONFIG_DIR as LNC_CONFIG_DIR,
)
from neuron_dra.driver.deploy.manifests import (
    LNC_LABEL as LNC_LABEL,
)
from neuron_dra.driver.deploy.manifests import (
    NODE_GROUP_LABEL as NODE_GROUP_LABEL,
)
from neuron_dra.driver.deploy.manifests import (
    NODE_NAME_EXTRA as NODE_NAME_EXTRA,
)
from neuron_dra.driver.deploy.manifests import (
    NODE_POOL_LABEL as NODE_POOL_LABEL,
)
from neuron_dra.driver.deploy.manifests import (
    POD_SELECTOR as POD_SELECTOR,
)
from neuron_dra.driver.deploy.manifests import (
    RBAC_RULES as RBAC_RULES,
)
from neuron_dra.driver.deploy.manifests import (
    HostMount as HostMount,
)
from neuron_dra.driver.deploy.manifests import (
    admission_policy as admission_policy,
)
from neuron_dra.driver.deploy.manifests import (
    admission_policy_binding as admission_policy_binding,
)
from neuron_dra.driver.deploy.manifests import (
    catalog_config_map as catalog_config_map,
)
from neuron_dra.driver.deploy.manifests import (
    cluster_role as cluster_role,
)
from neuron_dra.driver.deploy.manifests import (
    cluster_role_binding as cluster_role_binding,
)
from neuron_dra.driver.deploy.manifests import (
    core_device_class as core_device_class,
)
from neuron_dra.driver.deploy.manifests import (
    core_partitions_arg as core_partitions_arg,
)
from neuron_dra.driver.deploy.manifests import (
    daemonset as daemonset,
)
from neuron_dra.driver.deploy.manifests import (
    dashboard_config_map as dashboard_config_map,
)
from neuron_dra.driver.deploy.manifests import (
    device_class as device_class,
)
from neuron_dra.driver.deploy.manifests import (
    driver_args as driver_args,
)
from neuron_dra.driver.deploy.manifests import (
    driver_env as driver_env,
)
from neuron_dra.driver.deploy.manifests import (
    host_mounts as host_mounts,
)
from neuron_dra.driver.deploy.manifests import (
    manifests as manifests,
)
from neuron_dra.driver.deploy.manifests import (
    metrics_service as metrics_service,
)
from neuron_dra.driver.deploy.manifests import (
    namespace as namespace,
)
from neuron_dra.driver.deploy.manifests import (
    network_policy as network_policy,
)
from neuron_dra.driver.deploy.manifests import (
    object_key as object_key,
)
from neuron_dra.driver.deploy.manifests import (
    pod_monitor as pod_monitor,
)
from neuron_dra.driver.deploy.manifests import (
    service_account as service_account,
)
from neuron_dra.driver.deploy.options import (
    DEFAULT_CORE_EXTENDED_RESOURCE as DEFAULT_CORE_EXTENDED_RESOURCE,
)
from neuron_dra.driver.deploy.options import (
    DEFAULT_DAEMONSET as DEFAULT_DAEMONSET,
)
from neuron_dra.driver.deploy.options import (
    DEFAULT_DASHBOARD_LABEL as DEFAULT_DASHBOARD_LABEL,
)
from neuron_dra.driver.deploy.options import (
    DEFAULT_EXTENDED_RESOURCE as DEFAULT_EXTENDED_RESOURCE,
)
from neuron_dra.driver.deploy.options import (
    DEFAULT_HOST_ROOT as DEFAULT_HOST_ROOT,
)
from neuron_dra.driver.deploy.options import (
    DEFAULT_IMAGE as DEFAULT_IMAGE,
)
from neuron_dra.driver.deploy.options import (
    DEFAULT_NAMESPACE as DEFAULT_NAMESPACE,
)
from neuron_dra.driver.deploy.options import (
    DEFAULT_SERVICE_ACCOUNT as DEFAULT_SERVICE_ACCOUNT,
)
from neuron_dra.driver.deploy.options import (
    IMAGE_REPOSITORY as IMAGE_REPOSITORY,
)
from neuron_dra.driver.deploy.options import (
    KUBERNETES_FEATURES as KUBERNETES_FEATURES,
)
from neuron_dra.driver.deploy.options import (
    MAX_ROLLOUT_PODS as MAX_ROLLOUT_PODS,
)
from neuron_dra.driver.deploy.options import (
    MIN_MINOR as MIN_MINOR,
)
from neuron_dra.driver.deploy.options import (
    DeployOptionError as DeployOptionError,
)
from neuron_dra.driver.deploy.options import (
    DriverDeployOptions as DriverDeployOptions,
)
from neuron_dra.driver.deploy.options import (
    DriverName as DriverName,
)
from neuron_dra.driver.deploy.options import (
    Manifest as Manifest,
)
from neuron_dra.driver.deploy.options import (
    Resources as Resources,
)
from neuron_dra.driver.deploy.options import (
    namespace_for as namespace_for,
)
from neuron_dra.driver.model.slices import CAPACITY_BLOCK_LABEL as CAPACITY_BLOCK_LABEL  # for components
