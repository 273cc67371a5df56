"""Images: references, the content store, pulls, and the snapshotter that unpacks layers.

- ``client.images.reference``: image references, parsed and normalised as containerd does.
- ``client.images.content``: the content store, verified blobs by digest.
- ``client.images.manifests``: the OCI image model: media types, descriptors, manifests, indexes.
- ``client.images.skopeo``: what a pull gives skopeo and what its answers mean.
- ``client.images.arrivals``: blobs hashed and staged as skopeo finishes them.
- ``client.images.pull``: pulling from a registry with skopeo into the content store.
- ``client.images.store``: image records by id, tag and digest (a file per image).
- ``client.images.service``: the node's images as CRI's ImageService means them (pull, list,
  status, remove, shared pulls, garbage collection).
- ``client.images.unpack``: applying one layer tar to an empty directory in overlayfs's format.
- ``client.images.snapshots``: committed layer chains and active overlay snapshots (containerd's
  overlayfs snapshotter).

Nothing is imported here: each module is loaded by the code that uses it.
"""
