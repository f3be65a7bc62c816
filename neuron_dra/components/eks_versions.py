"""The Kubernetes minors EKS offers, with their support dates: the one table the EKS checks read. Pure Python.

Source: the EKS user guide, "Understand the Kubernetes version lifecycle on EKS" (awsdocs/amazon-eks-user-guide,
latest/ug/versioning/kubernetes-versions.adoc), as docs/kubernetes-versions.md §1 records it with the date it
was read. A minor is under standard support for 14 months after its EKS release, then under extended support
(extra cost per cluster-hour) for 12 more; after that EKS creates no cluster of it. A minor the table does not
list is one EKS does not offer (yet): the local cluster may still run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime


@dataclass(frozen=True)
class EksVersion:
    minor: str  # "1.36"
    upstream_release: date
    eks_release: date
    end_of_standard_support: date
    end_of_extended_support: date


EKS_VERSIONS: tuple[EksVersion, ...] = (
    EksVersion("1.34", date(2025, 8, 27), date(2025, 10, 2), date(2026, 12, 2), date(2027, 12, 2)),
    EksVersion("1.35", date(2025, 12, 17), date(2026, 1, 28), date(2027, 3, 27), date(2028, 3, 27)),
    EksVersion("1.36", date(2026, 4, 22), date(2026, 6, 2), date(2027, 8, 2), date(2028, 8, 2)),
)
SOON_DAYS = 60  # EKS announces the end of standard support at least this many days ahead


def eks_version(minor: str) -> EksVersion | None:
    """The table's entry for `minor` ("1.36"), or None when EKS does not offer it."""
    return next((v for v in EKS_VERSIONS if v.minor == minor), None)


def offered(today: date) -> tuple[str, ...]:
    """The minors EKS creates clusters of on `today` (not past their extended support)."""
    return tuple(v.minor for v in EKS_VERSIONS if today <= v.end_of_extended_support)


def today_utc() -> date:
    """EKS's dates are UTC days."""
    return datetime.now(UTC).date()


def support_warning(version: EksVersion, today: date) -> str | None:
    """What to tell a user of `version` on `today`: past (or near) the end of standard support; else None."""
    v = version
    upgrade = "; plan the upgrade to a newer minor"
    if today > v.end_of_standard_support:
        return (f"Kubernetes {v.minor} left EKS standard support on {v.end_of_standard_support.isoformat()}: the "
                f"cluster runs on extended support, which costs extra per cluster-hour, until "
                f"{v.end_of_extended_support.isoformat()} (then EKS upgrades the control plane itself){upgrade}")
    days = (v.end_of_standard_support - today).days
    if days <= SOON_DAYS:
        return (f"Kubernetes {v.minor}: EKS standard support ends on {v.end_of_standard_support.isoformat()} (in "
                f"{days} days); after that extended support costs extra per cluster-hour{upgrade}")
    return None
