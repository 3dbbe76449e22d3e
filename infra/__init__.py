"""Deployment assets for tidal: Dockerfiles, Kubernetes manifests and the tools that render them."""
