"""
The Pod Security Standards' "restricted" profile (Kubernetes 1.28 to 1.30, baseline checks
included), as the API server's PodSecurity admission applies it to a pod spec: offline, so a
test can show that the pods a chart or Spark creates are admitted in a namespace enforcing it.
Returns the violations, worded after the admission's messages; an empty list means admitted.
"""

from collections.abc import Iterable, Mapping
from typing import Any

RESTRICTED_VOLUMES = {
    'configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral', 'persistentVolumeClaim',
    'projected', 'secret',
}  # fmt: skip
BASELINE_CAPABILITIES = {
    'AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'MKNOD',
    'NET_BIND_SERVICE', 'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT',
}  # fmt: skip
SAFE_SYSCTLS = {
    'kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range', 'net.ipv4.ip_unprivileged_port_start',
    'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range', 'net.ipv4.ip_local_reserved_ports',
    'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout', 'net.ipv4.tcp_keepalive_intvl',
    'net.ipv4.tcp_keepalive_probes',
}  # fmt: skip
SELINUX_TYPES = {'', 'container_t', 'container_init_t', 'container_kvm_t'}


def _containers(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for key in ('initContainers', 'containers', 'ephemeralContainers'):
        yield from spec.get(key) or []


def restricted_violations(spec: Mapping[str, Any]) -> list[str]:
    """What keeps a pod with this spec out of a namespace enforcing "restricted"."""
    found = _pod_violations(spec)
    for container in _containers(spec):
        found += _container_violations(container, spec.get('securityContext') or {})
    return found


def _pod_violations(spec: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    context = spec.get('securityContext') or {}
    for field in ('hostNetwork', 'hostPID', 'hostIPC'):
        if spec.get(field):
            found.append(f'host namespaces ({field}=true)')
    for volume in spec.get('volumes') or []:
        kinds = set(volume) - {'name'}
        if not kinds <= RESTRICTED_VOLUMES:  # hostPath among them
            found.append(f'restricted volume types ({volume["name"]!r} uses {sorted(kinds)})')
    found += [f'forbidden sysctl {s.get("name")!r}' for s in context.get('sysctls') or []
              if s.get('name') not in SAFE_SYSCTLS]  # fmt: skip
    if context.get('runAsUser') == 0:
        found.append('runAsUser=0 (pod)')
    if (context.get('seccompProfile') or {}).get('type') == 'Unconfined':
        found.append('seccompProfile type "Unconfined" (pod)')
    if ((context.get('seLinuxOptions') or {}).get('type') or '') not in SELINUX_TYPES:
        found.append('seLinuxOptions type (pod)')
    return found


def _container_violations(container: Mapping[str, Any], pod: Mapping[str, Any]) -> list[str]:
    name = container.get('name')
    context = container.get('securityContext') or {}
    caps = context.get('capabilities') or {}
    added = set(caps.get('add') or [])
    seccomp = (context.get('seccompProfile') or {}).get(
        'type', (pod.get('seccompProfile') or {}).get('type')
    )
    checks = {
        'privileged': bool(context.get('privileged')),
        'allowPrivilegeEscalation != false': context.get('allowPrivilegeEscalation') is not False,
        'unrestricted capabilities (must drop ALL)': 'ALL' not in (caps.get('drop') or []),
        f'unrestricted capabilities (adds {sorted(added)})': bool(
            added - {'NET_BIND_SERVICE'} or added - BASELINE_CAPABILITIES
        ),
        'runAsNonRoot != true': context.get('runAsNonRoot', pod.get('runAsNonRoot')) is not True,
        'runAsUser=0': context.get('runAsUser') == 0,
        'seccompProfile (must be RuntimeDefault or Localhost)': seccomp
        not in ('RuntimeDefault', 'Localhost'),
        'procMount': context.get('procMount', 'Default') != 'Default',
        'seLinuxOptions type': ((context.get('seLinuxOptions') or {}).get('type') or '')
        not in SELINUX_TYPES,
        'hostPort': any(port.get('hostPort') for port in container.get('ports') or []),
    }
    return [f'{what} (container {name!r})' for what, failed in checks.items() if failed]
