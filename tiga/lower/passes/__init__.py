"""lower/passes: the lowering passes, each a pure IR -> IR function (verified output)."""
from .lower_domain_to_iter import lower_domain_to_iter
from .lower_iter_to_kernel import lower_iter_to_kernel
from .lower_program_to_domain import lower_program_to_domain
from .plan_distributed_tasks import plan_distributed_tasks
from .plan_halo_tasks import plan_halo_tasks
from .plan_paged_tasks import plan_paged_tasks
from .select_kernel_schedule import select_kernel_schedule

# tiga-opt's pass names (the report's `-gf-<name>` spellings drop the prefix); plan_halo_tasks
# is not one: it takes a rank's share of a partition besides the module
PASSES = {
    "lower-domain-to-iter": lower_domain_to_iter,
    "lower-iter-to-kernel": lower_iter_to_kernel,
    "select-kernel-schedule": select_kernel_schedule,
    "plan-distributed-tasks": plan_distributed_tasks,
}

__all__ = ["PASSES", "lower_domain_to_iter", "lower_iter_to_kernel", "lower_program_to_domain",
           "plan_distributed_tasks", "plan_halo_tasks", "plan_paged_tasks",
           "select_kernel_schedule"]
