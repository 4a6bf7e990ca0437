"""``KubernetesJob``: pods running listening agents, from a manifest we generate.

``manifest()`` is a headless Service and a StatefulSet per mesh; each pod runs
``monarch-nb agent --listen`` with the job's key mounted from a Secret, and
``state()`` attaches to the pods by their stable DNS names, the same
``attach`` path as every other job.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from typing import Any

from ._job import JobTrait, _meshes


class KubernetesJob(JobTrait):
    """Pods that run ``monarch-nb agent --listen``; ``manifest()`` is what to apply.

    ``apply()`` runs ``kubectl apply`` on the manifest; the pods read the key
    from a Secret made from the job's key file (``kubectl create secret
    generic NAME --from-file=agent.key=KEYFILE``). ``state()`` attaches to
    each pod by its stable name through the headless Service.
    """

    kind = "kubernetes"

    def __init__(
        self,
        meshes: Mapping[str, int],
        *,
        image: str,
        namespace: str = "default",
        name: str = "monarch-nb",
        port: int = 7000,
        gpus_per_node: int | None = None,
        python: str = "python",
    ) -> None:
        super().__init__()
        self.meshes = _meshes(meshes, "KubernetesJob")
        self.image, self.namespace, self.name = image, namespace, name
        self.port, self.gpus_per_node, self.python = port, gpus_per_node, python

    def spec(self) -> dict[str, Any]:
        return {
            "meshes": self.meshes,
            "image": self.image,
            "namespace": self.namespace,
            "name": self.name,
            "port": self.port,
            "gpus_per_node": self.gpus_per_node,
            "python": self.python,
        }

    def addresses(self) -> dict[str, list[str]]:
        """Where each mesh's agents listen: ``tcp://POD.SERVICE.NAMESPACE:PORT``."""
        return {
            mesh: [
                f"tcp://{self.name}-{mesh}-{i}.{self.name}-{mesh}.{self.namespace}:{self.port}"
                for i in range(count)
            ]
            for mesh, count in self.meshes.items()
        }

    def manifest(self) -> list[dict[str, Any]]:
        """A headless Service and a StatefulSet per mesh (kubectl-applyable objects)."""
        objects: list[dict[str, Any]] = []
        for mesh, count in self.meshes.items():
            full = f"{self.name}-{mesh}"
            labels = {"app": self.name, "monarch-nb/mesh": mesh}
            resources = (
                {"limits": {"nvidia.com/gpu": self.gpus_per_node}} if self.gpus_per_node else {}
            )
            command = [
                "sh",
                "-c",
                f"exec {self.python} -m monarch_nb.agent --listen tcp://0.0.0.0:{self.port} "
                "--key-file /etc/monarch-nb/agent.key --host-index ${HOSTNAME##*-}",
            ]
            container = {
                "name": "agent",
                "image": self.image,
                "command": command,
                "ports": [{"containerPort": self.port}],
                "resources": resources,
                "volumeMounts": [{"name": "key", "mountPath": "/etc/monarch-nb", "readOnly": True}],
            }
            key_volume = {"secretName": f"{self.name}-key", "defaultMode": 0o400}
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": full, "namespace": self.namespace, "labels": labels},
                    "spec": {
                        "clusterIP": "None",
                        "selector": labels,
                        "ports": [{"port": self.port}],
                    },
                }
            )
            objects.append(
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "metadata": {"name": full, "namespace": self.namespace, "labels": labels},
                    "spec": {
                        "serviceName": full,
                        "replicas": count,
                        "podManagementPolicy": "Parallel",
                        "selector": {"matchLabels": labels},
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {
                                "containers": [container],
                                "volumes": [{"name": "key", "secret": key_volume}],
                            },
                        },
                    },
                }
            )
        return objects

    def _kubectl(self, *args: str, stdin: bytes | None = None) -> None:
        subprocess.run(["kubectl", "-n", self.namespace, *args], input=stdin, check=True)

    def _create(self, key_file: str) -> dict[str, Any]:
        self._kubectl(
            "create", "secret", "generic", f"{self.name}-key", f"--from-file=agent.key={key_file}"
        )
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": self.manifest()})
        self._kubectl("apply", "-f", "-", stdin=body.encode())
        return {"meshes": self.addresses()}

    def _kill(self) -> None:
        for mesh in self.meshes:
            self._kubectl("delete", "statefulset,service", f"{self.name}-{mesh}")
        self._kubectl("delete", "secret", f"{self.name}-key")
