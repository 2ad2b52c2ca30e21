"""The Kubernetes manifests of docs/kubernetes.md (tools/k8s/): they parse, run the command the page
documents on 2 nodes x 8 GPUs, and hold what a preempted or lost pod needs to come back and resume."""
import re
import shlex

import pytest
import yaml
from helpers import ROOT

pytestmark = pytest.mark.quick

IMAGE_ROOT = '/opt/xcit-dense'  # where the manifests' image holds the install


def documented_command() -> list:
    """The one command the page's code blocks give every pod."""
    commands = re.findall(r'^bash tools/dist_train\.sh .*$', (ROOT / 'docs/kubernetes.md').read_text(), re.M)
    assert len(commands) == 1, commands
    return shlex.split(commands[0])


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / 'tools/k8s' / name).read_text())


def test_the_documented_command_trains_a_recipe_on_8_processes_and_resumes():
    command = documented_command()
    assert (ROOT / command[2]).is_file() and command[3] == '8'
    assert command[-1] == '--resume' and command[command.index('--work-dir') + 1].startswith('work_dirs/')


def shared_mounts(volumes: list, mounts: list) -> dict:
    """mount path -> sub path of the mounts of the claim-backed (shared) volume."""
    shared = {v['name'] for v in volumes if 'persistentVolumeClaim' in v}
    assert len(shared) == 1, volumes
    return {m['mountPath']: m.get('subPath') for m in mounts if m['name'] in shared}


def test_the_pytorchjob_runs_the_documented_command_in_every_pod():
    job = load('pytorchjob.yaml')
    assert (job['apiVersion'], job['kind']) == ('kubeflow.org/v1', 'PyTorchJob')
    replicas = job['spec']['pytorchReplicaSpecs']
    assert {k: r['replicas'] for k, r in replicas.items()} == {'Master': 1, 'Worker': 1}
    assert job['spec']['nprocPerNode'] == '8'
    for replica in replicas.values():
        assert replica['restartPolicy'] == 'OnFailure'  # ExitCode would not retry torchrun's exit 1
        pod = replica['template']['spec']
        assert pod['terminationGracePeriodSeconds'] > 30  # torchrun's 30 s for the checkpoint, then the exit
        container, = pod['containers']
        assert container['name'] == 'pytorch' and container['workingDir'] == IMAGE_ROOT
        assert container['command'] == documented_command()
        assert container['resources']['limits']['nvidia.com/gpu'] == 8
        assert shared_mounts(pod['volumes'], container['volumeMounts']) == {
            f'{IMAGE_ROOT}/data': 'data', f'{IMAGE_ROOT}/work_dirs': 'work_dirs'}


def test_the_trainjob_runs_the_documented_command_in_every_pod():
    job = load('trainjob.yaml')
    assert (job['apiVersion'], job['kind']) == ('trainer.kubeflow.org/v1alpha1', 'TrainJob')
    trainer = job['spec']['trainer']
    assert (trainer['numNodes'], trainer['numProcPerNode'], trainer['resourcesPerNode']['limits']['nvidia.com/gpu']) \
        == (2, 8, 8)
    shell, flag, line = trainer['command']
    assert (shell, flag) == ('bash', '-c')
    assert shlex.split(line) == ['cd', IMAGE_ROOT, '&&', 'exec', *documented_command()]  # exec: torchrun stays PID 1
    override, = job['spec']['podTemplateOverrides']
    assert override['targetJobs'] == [{'name': 'node'}]
    container, = override['spec']['containers']
    assert container['name'] == 'node'
    assert shared_mounts(override['spec']['volumes'], container['volumeMounts']) == {
        f'{IMAGE_ROOT}/data': 'data', f'{IMAGE_ROOT}/work_dirs': 'work_dirs'}
