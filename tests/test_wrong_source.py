"""A mistyped source is an error, never a new dataset: ``stager run`` writes nothing but its own outputs.

Synthetic data is written only by the commands that exist to write it
(``stager make-dataset``, ``stager demo``), into the directory they are given.
"""

import os
import subprocess

import boto3
import pytest
from conftest import REPO, stager_cmd

from stager.slows3 import ObjectStore
from stager.slows3.server import CREDENTIALS

DEMO = os.path.join(REPO, "configs", "demo.yaml")


def stager(tmp_path, *args, env=None):
    return subprocess.run(stager_cmd(*args), capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, TMPDIR=str(tmp_path), **(env or {})))


def test_a_missing_source_is_an_error_naming_it_and_nothing_is_created(tmp_path):
    missing = tmp_path / "nonexistent"
    proc = stager(tmp_path, "run", DEMO, "--quiet", "--set", f"dataset.source={missing}",
                  "--set", f"staging.local_dir={tmp_path / 'local'}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"dataset.source {missing} does not exist" in proc.stderr
    assert "stager make-dataset --config" in proc.stderr  # the demo's config describes its data: how to make it
    assert "Traceback" not in proc.stderr
    assert not missing.exists()
    assert sorted(os.listdir(tmp_path)) == [], "the run wrote something"


def test_a_url_source_never_becomes_local_files(tmp_path):
    bucket = "stager-empty"
    with ObjectStore() as server:
        boto3.client("s3", endpoint_url=server.endpoint_url, **{
            "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "region_name": CREDENTIALS["AWS_DEFAULT_REGION"]}).create_bucket(Bucket=bucket)
        proc = stager(tmp_path, "run", DEMO, "--quiet", "--set", f"dataset.source=s3://{bucket}/train",
                      "--set", f"dataset.endpoint_url={server.endpoint_url}", "--set", "slowfs.enabled=false",
                      "--set", f"staging.local_dir={tmp_path / 'local'}", env=CREDENTIALS)
        made = stager(tmp_path, "make-dataset", "--config", DEMO, "--set", f"dataset.source=s3://{bucket}/train",
                      env=CREDENTIALS)
        listed = boto3.client("s3", endpoint_url=server.endpoint_url, **{
            "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "region_name": CREDENTIALS["AWS_DEFAULT_REGION"]}).list_objects_v2(Bucket=bucket)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"s3://{bucket}/train/manifest.tsv" in proc.stderr and "no such object" in proc.stderr
    assert made.returncode == 2 and "is not a local directory" in made.stderr, made.stderr
    assert listed.get("KeyCount", 0) == 0, "nothing was written into the bucket"
    assert sorted(os.listdir(tmp_path)) == [], "a local directory named after the URL was made"


def test_make_dataset_writes_the_configs_synthetic_data_once_and_run_reads_it(tmp_path):
    data = tmp_path / "data"
    args = ("--set", f"dataset.source={data}", "--set", "synthetic.samples=40", "--set", "synthetic.bytes=2000")
    first = stager(tmp_path, "make-dataset", "--config", DEMO, "--quiet", *args)
    assert first.returncode == 0 and "wrote 40 samples" in first.stdout, first.stderr
    again = stager(tmp_path, "make-dataset", "--config", DEMO, "--quiet", *args)
    assert again.returncode == 0 and "already lists the 40 samples" in again.stdout, again.stderr
    other = stager(tmp_path, "make-dataset", "--config", DEMO, "--quiet", *args[:2], "--set", "synthetic.samples=50")
    assert other.returncode == 2 and "lists 40 samples but synthetic.samples is 50" in other.stderr
    ran = stager(tmp_path, "run", DEMO, "--quiet", *args, "--set", "slowfs.open_ms=1",
                 "--set", f"staging.local_dir={tmp_path / 'local'}", "--set", "run.compute_ms=0")
    assert ran.returncode == 0, ran.stderr
    assert "40 samples" in ran.stdout and "staged 40 files" in ran.stdout


@pytest.mark.parametrize("option", ["--record", "--report", "run.state_file"])
def test_an_output_inside_the_source_is_refused_before_anything_is_written(tmp_path, option):
    data = tmp_path / "data"
    assert stager(tmp_path, "make-dataset", str(data), "--samples", "8", "--bytes", "2000", "--quiet").returncode == 0
    before = sorted(os.listdir(data))
    inside = data / "out"
    given = ["--set", f"run.state_file={inside}"] if option == "run.state_file" else [option, str(inside)]
    proc = stager(tmp_path, "run", DEMO, "--quiet", "--set", f"dataset.source={data}", "--set", "slowfs.enabled=false",
                  "--set", "synthetic.samples=0", "--set", f"staging.local_dir={tmp_path / 'local'}", *given)
    assert proc.returncode == 2, proc.stderr
    assert f"{option} {inside} lies inside dataset.source {data}" in proc.stderr
    assert sorted(os.listdir(data)) == before and not (tmp_path / "local").exists()


def test_make_dataset_refuses_a_url_and_a_directory_holding_other_files(tmp_path):
    url = stager(tmp_path, "make-dataset", "s3://bucket/prefix", "--samples", "4")
    assert url.returncode == 2 and "is a URL" in url.stderr
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my work")
    proc = stager(tmp_path, "make-dataset", "--config", DEMO, "--set", f"dataset.source={mine}")
    assert proc.returncode == 2 and "already holds files but no manifest.tsv" in proc.stderr
    assert os.listdir(mine) == ["notes.txt"] and not (tmp_path / "s3:").exists()
