"""Which pods and containers use an image: what RemoveImage and image GC ask the pod layer."""

from __future__ import annotations

from client.cri.pod.base import PodServiceBase


class ImageUse(PodServiceBase):
    """The pod service's images part (:class:`client.cri.pod.PodService` is all of them)."""

    def image_user(self, image_id: str) -> str:
        """Who uses image ``image_id`` and what to remove before it ("" when nothing does): a
        container, a container as an image volume, or a pod as its sandbox image. RemoveImage
        refuses the image meanwhile."""
        if self.image_in_use(image_id):
            return "a container; remove the container first"
        for c in self.store.list_containers():
            paths = [path for path, used in c.image_volumes.items() if used == image_id]
            if paths:
                return f"container {c.container_id} as its image volume at {paths[0]}; remove the container first"
        pods = [record.pod_id for record in self.store.list() if record.sandbox_image_id == image_id]
        if pods:
            return f"pod {pods[0]} as its sandbox image; remove the pod first"
        return ""

    def image_in_use(self, image_id: str) -> list[str]:
        """The ids of the containers (in any state) made from image ``image_id``: while there
        are any, :meth:`image_user` names a container (RemoveImage refuses the image)."""
        return [c.container_id for c in self.store.list_containers() if c.image_id == image_id]
