"""ImageService's ListImages, StreamImages, ImageStatus, PullImage and RemoveImage over the node's images
(:class:`client.images.service.Images`): translation only.

PullImage answers with the image's id (its config digest) as ``image_ref``; ImageStatus of an image
the node lacks is an empty response (CRI's "not present"), its verbose ``info`` is containerd's
shape: ``{"info": "{\"chainID\": ..., \"imageSpec\": <the image config>}"}``; RemoveImage of an
image that is not there succeeds, of one a container uses is FAILED_PRECONDITION. ListImages with a
filter lists the image it names, if any. Images are the node's, the same for every runtime handler:
an ImageSpec's ``runtime_handler`` must be one of config ``runtime_handlers`` (or empty), and an
unknown one is INVALID_ARGUMENT, as CRI asks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from shim.cri.api import api_pb2
from shim.rpc.status import InvalidArgument

from client.images.service import image_user
from client.images.skopeo import AuthConfig
from client.images.store import ImageRecord

from .chunks import chunks
from .handlers import Handlers

__all__ = ["ImageStore", "image"]


def image(record: ImageRecord) -> api_pb2.Image:
    """The CRI Image of a record."""
    uid, username = image_user(record.config)
    return api_pb2.Image(id=record.image_id, repo_tags=record.repo_tags, repo_digests=record.repo_digests,
                         size=record.size, uid=api_pb2.Int64Value(value=uid) if uid is not None else None,
                         username=username, spec=api_pb2.ImageSpec(image=record.image_id))


def _auth(auth: api_pb2.AuthConfig) -> AuthConfig | None:
    return AuthConfig(username=auth.username, password=auth.password, auth=auth.auth,
                      server_address=auth.server_address, identity_token=auth.identity_token,
                      registry_token=auth.registry_token) or None


class ImageStore(Handlers):
    """ListImages, StreamImages, ImageStatus, PullImage, RemoveImage."""

    async def ListImages(self, request: api_pb2.ListImagesRequest, context: Any) -> api_pb2.ListImagesResponse:
        return api_pb2.ListImagesResponse(images=self._list_images(request))

    async def StreamImages(self, request: api_pb2.StreamImagesRequest,
                           context: Any) -> AsyncIterator[api_pb2.StreamImagesResponse]:
        for chunk in chunks(self._list_images(request)):
            yield api_pb2.StreamImagesResponse(images=chunk)

    def _list_images(self, request: api_pb2.ListImagesRequest | api_pb2.StreamImagesRequest) -> list[api_pb2.Image]:
        name = self._image_name(request.filter.image, "filter.image") if request.HasField("filter") else ""
        return [image(r) for r in self.images.list(name)]

    def _image_name(self, spec: api_pb2.ImageSpec, where: str = "image") -> str:
        """The image ``spec`` names; InvalidArgument for a runtime handler this node does not have."""
        handler = spec.runtime_handler
        if handler and handler not in self.config.runtime_handlers:
            raise InvalidArgument(f"{where}.runtime_handler {handler!r} is not a runtime handler of this node "
                                  f"(runtime_handlers: {', '.join(self.config.runtime_handlers)})")
        return spec.image

    async def ImageStatus(self, request: api_pb2.ImageStatusRequest, context: Any) -> api_pb2.ImageStatusResponse:
        record = self.images.status(self._image_name(request.image))
        if record is None:
            return api_pb2.ImageStatusResponse()  # image unset: "not present"
        info = {}
        if request.verbose:
            info["info"] = json.dumps({"chainID": record.chain_id, "imageSpec": record.config})
        return api_pb2.ImageStatusResponse(image=image(record), info=info)

    async def PullImage(self, request: api_pb2.PullImageRequest, context: Any) -> api_pb2.PullImageResponse:
        record = await self.images.pull(self._image_name(request.image), _auth(request.auth))
        return api_pb2.PullImageResponse(image_ref=record.image_id)

    async def RemoveImage(self, request: api_pb2.RemoveImageRequest, context: Any) -> api_pb2.RemoveImageResponse:
        await self.images.remove(self._image_name(request.image))
        return api_pb2.RemoveImageResponse()
