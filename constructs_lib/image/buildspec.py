"""The training image's buildspec: log in, skip a tag that is already in the repository, build with BuildKit and
push (image and layer cache), check. Pure Python: everything variable comes from the project's environment."""

from __future__ import annotations

SKIP_MARKER = '"${CODEBUILD_SRC_DIR:-.}/.image-exists"'
"""File the pre_build phase creates when the tag is already in the repository (the build phase then skips)."""


def buildspec() -> dict:
    """The build's buildspec (everything variable comes from the project's environment variables).

    pre_build logs in to the DLC registry and to our registry, then looks the tag up in our repository and
    marks the build to skip when it is there. build runs the BuildKit built into CodeBuild's Docker (``docker``
    driver: no builder image to pull), takes the layer cache from the last image (``CACHE_TAG``), writes the
    inline cache into the new image and pushes it under its tag and ``CACHE_TAG``. post_build checks that the
    tag is in the repository.
    """
    base_registry = '"$BASE_IMAGE_ACCOUNT.dkr.ecr.$BASE_IMAGE_REGION.$BASE_IMAGE_DOMAIN"'
    cache_ref = "type=registry,ref=$REPOSITORY_URI:$CACHE_TAG"  # the last image built, with its inline cache
    describe = (
        'aws ecr describe-images --region "$BASE_IMAGE_REGION" --repository-name "$REPOSITORY_NAME" '
        '--image-ids imageTag="$IMAGE_TAG"'
    )
    skip = f"if [ -f {SKIP_MARKER} ]; then echo 'Image exists: nothing to build'; else "
    build = (
        "docker buildx build --builder default --progress plain --platform linux/amd64 "
        "--provenance false --sbom false "
        '--build-arg BASE_ACCOUNT="$BASE_IMAGE_ACCOUNT" --build-arg BASE_REGION="$BASE_IMAGE_REGION" '
        '--build-arg BASE_DOMAIN="$BASE_IMAGE_DOMAIN" --build-arg BASE_TAG="$BASE_IMAGE_TAG" '
        f'--cache-from "{cache_ref}" '
        "--cache-to type=inline "
        '--tag "$REPOSITORY_URI:$IMAGE_TAG" --tag "$REPOSITORY_URI:$CACHE_TAG" --push .'
    )
    return {
        "version": "0.2",
        "phases": {
            "pre_build": {
                "on-failure": "ABORT",
                "commands": [
                    "docker buildx version",
                    'aws ecr get-login-password --region "$BASE_IMAGE_REGION" '
                    f"| docker login --username AWS --password-stdin {base_registry}",
                    'aws ecr get-login-password --region "$BASE_IMAGE_REGION" '
                    '| docker login --username AWS --password-stdin "${REPOSITORY_URI%%/*}"',
                    f"if {describe} > /dev/null 2>&1; then "
                    'echo "$REPOSITORY_URI:$IMAGE_TAG already exists: not building it again"; '
                    f"touch {SKIP_MARKER}; "
                    'else echo "Building $REPOSITORY_URI:$IMAGE_TAG"; fi',
                ],
            },
            "build": {
                "on-failure": "ABORT",
                "commands": [skip + build + "; fi"],
            },
            "post_build": {
                "on-failure": "ABORT",
                "commands": [
                    f"{describe} --query 'imageDetails[0].imageDigest' --output text",
                    'echo "Image: $REPOSITORY_URI:$IMAGE_TAG"',
                ],
            },
        },
    }
