"""DVC round trip through an S3 remote: moto's S3 server on 127.0.0.1 (no other traffic), fake
credentials from the environment, the remote configured with two `dvc remote` lines and committed.
"""

from __future__ import annotations

import shutil

import pytest

from hybridlab import cache

from test_dvc_roundtrip import TARGETS
from smoke import SCALE, built_repo, dvc, git, pipeline_env, results_hashes, snakemake

moto_server = pytest.importorskip("moto.server", reason="S3 test needs `pip install 'moto[server]'`")
pytest.importorskip("dvc_s3", reason="S3 test needs `pip install dvc-s3`")
boto3 = pytest.importorskip("boto3")

pytestmark = [pytest.mark.slow, pytest.mark.smoke_dag]
BUCKET = "hybridlab-test"


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory):
    """A moto S3 server on a free loopback port and the environment that reaches only it."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    home = tmp_path_factory.mktemp("s3-home")
    env = pipeline_env(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
        # No profile, config or credentials file of the user's, and no proxy for loopback.
        AWS_CONFIG_FILE=str(home / "aws-config"), AWS_SHARED_CREDENTIALS_FILE=str(home / "aws-credentials"),
        NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
        DVC_GLOBAL_CONFIG_DIR=str(home / "dvc-global"), DVC_SYSTEM_CONFIG_DIR=str(home / "dvc-sys"),
        DVC_SITE_CACHE_DIR=str(home / "dvc-site"),
    )
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        env.pop(key, None)
    endpoint = f"http://{host}:{port}"
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    yield endpoint, env, s3
    server.stop()


def test_push_and_pull_through_s3(s3_env, tmp_path_factory, smoke_workdir, monkeypatch):
    endpoint, env, s3 = s3_env
    work = tmp_path_factory.mktemp("dvc-s3")
    repo = work / "repo"
    shutil.copytree(built_repo(smoke_workdir, TARGETS), repo, symlinks=True)
    stages = cache.phases_for(TARGETS)

    dvc(repo, "remote", "add", "--default", "s3", f"s3://{BUCKET}/cache", env=env)
    dvc(repo, "remote", "modify", "s3", "endpointurl", endpoint, env=env)
    dvc(repo, "commit", "--force", *stages, env=env)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cache smoke results on S3")
    dvc(repo, "push", env=env)

    # Every object of the local DVC cache is in the bucket, and nothing went to the directory remote.
    local_objects = {p.relative_to(repo / ".dvc/cache/files").as_posix()
                     for p in (repo / ".dvc/cache/files").rglob("*") if p.is_file()}
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="cache/")
    remote_objects = {obj["Key"].removeprefix("cache/files/") for obj in listed.get("Contents", [])}
    assert local_objects and remote_objects == local_objects
    assert not (work / "hybridlab-dvc-remote").exists()

    clone = work / "clone"
    git(work, "clone", "-q", str(repo), str(clone))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    report = cache.pull(TARGETS, repo=clone, scale=SCALE)
    assert report.pulled == stages and report.to_build == {}
    assert results_hashes(clone, stages) == results_hashes(repo, stages)
    proc = snakemake(clone, "-n", *TARGETS, "--config", f"scale={SCALE}", env=env)
    assert cache.parse_job_stats(proc.stdout + proc.stderr) == {}
