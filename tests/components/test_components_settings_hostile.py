"""Issue 42 finding 8 (round 4 of attacks): stack settings values AWS would refuse are refused when the settings
are decoded (before any AWS call), with the same message as any other bad value of the setting: a trailing line
feed (`$` in a Python pattern matches before one), non-ASCII digits (`\\d` takes any Unicode digit), or numbers out
of range. Each hostile value has its own case; `test_every_hostile_setting_is_refused` runs them all as the
`attacks` round does."""

from __future__ import annotations

import json

import pytest

from neuron_dra.components.cluster import TrainiumClusterArgs
from neuron_dra.components.settings import NodeGroupSettings, SettingError, check_id
from neuron_dra.components.settings_schema import decode_settings

ARABIC_INDIC = "\u0661\u0660"  # "10" in Arabic-Indic digits
FULL_WIDTH_2 = "\uff12"  # full-width 2
CIDR = "an IPv4 CIDR block such as 10.0.0.0/16"
AZS = "AZ names such as us-east-2b"
ARNS = "IAM role or user ARNs"
CLUSTER = "1-100 letters, digits, '-' and '_', starting with a letter or digit"
ROLE = "arn:aws:iam::123456789012:role/admin"
WIDE_ROLE = ROLE.replace("123", "\uff11\uff12\uff13")  # full-width digits in the account

# (config key, raw config value, the value the message shows, what the message allows)
HOSTILE: list[tuple[str, str, str, str]] = [
    ("vpcCidr", "10.0.0.0/16\n", "'10.0.0.0/16\\n'", CIDR),
    ("vpcCidr", "999.999.999.999/99", "'999.999.999.999/99'", CIDR),
    ("vpcCidr", "10.0.0.0/33", "'10.0.0.0/33'", CIDR),
    ("vpcCidr", f"{ARABIC_INDIC}.0.0.0/16", f"'{ARABIC_INDIC}.0.0.0/16'", CIDR),
    ("publicAccessCidrs", json.dumps(["203.0.113.0/24\n"]), "'203.0.113.0/24\\n'", "IPv4 CIDR blocks such as"),
    ("availabilityZones", json.dumps(["us-east-2a\n"]), "'us-east-2a\\n'", AZS),
    ("availabilityZones", json.dumps([f"us-east-{FULL_WIDTH_2}a"]), f"'us-east-{FULL_WIDTH_2}a'", AZS),
    ("adminPrincipalArns", json.dumps([ROLE + "\n"]), repr(ROLE + "\n"), ARNS),
    ("adminPrincipalArns", json.dumps([WIDE_ROLE]), repr(WIDE_ROLE), ARNS),
    ("adminPrincipalArns", json.dumps([ROLE + "\u3000x"]), repr(ROLE + "\u3000x"), ARNS),
    ("clusterName", "training\n", "'training\\n'", CLUSTER),
    ("clusterName", "train\ning", "'train\\ning'", CLUSTER),
    ("clusterName", f"training-{FULL_WIDTH_2}", f"'training-{FULL_WIDTH_2}'", CLUSTER),
    ("nodeGroups", json.dumps([{"name": "trn2", "availabilityZone": "us-east-2a\n"}]), "'us-east-2a\\n'",
     "an AZ name such as us-east-2b"),
    ("kubernetesVersion", "1.36\n", "'1.36\\n'", "1.34 to 1.36, a Kubernetes minor version EKS offers"),
    ("vpcCniVersion", "v1.20.4-eksbuild.1\n", "'v1.20.4-eksbuild.1\\n'", "an EKS add-on version"),
]


def refusal(key: str, raw: str) -> str:
    with pytest.raises(SettingError) as err:
        decode_settings({f"neuron-dra:{key}": raw})
    return str(err.value)


@pytest.mark.parametrize(("key", "raw", "shown", "allowed"), HOSTILE,
                         ids=[f"{k}-{i}" for i, (k, *_rest) in enumerate(HOSTILE)])
def test_a_value_aws_would_refuse_is_refused_naming_the_setting(key: str, raw: str, shown: str,
                                                                allowed: str) -> None:
    message = refusal(key, raw)
    assert message.startswith(f"neuron-dra:{key}") and f"{shown} is not allowed; allowed: {allowed}" in message


@pytest.mark.parametrize("good", ["10.0.0.0/16", "0.0.0.0/0", "255.255.255.255/32"])
def test_valid_cidrs_still_pass(good: str) -> None:
    assert decode_settings({"neuron-dra:vpcCidr": good}).vpc_cidr == good


def test_the_components_args_refuse_the_same_values() -> None:
    """The components' Args share the settings' checks (one validation per fact)."""
    with pytest.raises(SettingError, match=r"TrainiumClusterArgs.cluster_name: 'training\\n' is not allowed"):
        TrainiumClusterArgs(cluster_name="training\n")
    with pytest.raises(SettingError, match=r"TrainiumClusterArgs\.admin_principal_arns"):
        TrainiumClusterArgs(admin_principal_arns=[ROLE + "\n"])
    with pytest.raises(SettingError, match=r"NodeGroupSettings\('g'\).availability_zone"):
        NodeGroupSettings(name="g", availability_zone="us-east-2a\n")
    with pytest.raises(SettingError, match="not allowed; allowed: subnet ids"):
        check_id("subnetIds", "subnet", "subnet-0123456789abcdef0\n")


@pytest.mark.attacks
def test_every_hostile_setting_is_refused() -> None:
    """Round 4 finding 8, replayed: every hostile value of the round is refused, none reaches AWS."""
    accepted = []
    for key, raw, _shown, _allowed in HOSTILE:
        try:
            decode_settings({f"neuron-dra:{key}": raw})
        except SettingError:
            continue
        accepted.append((key, raw))
    assert accepted == []
