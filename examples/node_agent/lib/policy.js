'use strict';
/**
 * A scripted executor policy for collaborative_task_solving / resource_allocation (JSON observations).
 *
 * The problem (see services/env_server/envs/allocation_problem.py, Problem.to_dict) has resources with
 * capacities and tasks with value_per_unit, demand_per_unit, max_units, min_units, plus exclusive task pairs.
 * The policy follows the leader's plan when it keeps every constraint, else allocates greedily.
 */

/**
 * Check an allocation against the problem's constraints.
 * @param {object} problem - Problem.to_dict() shape.
 * @param {object} alloc - Task name -> units (integers).
 * @returns {string[]} Violations (empty when the allocation is feasible).
 */
function violations(problem, alloc) {
  const out = [];
  const used = {};
  for (const r of problem.resources) used[r.name] = 0;
  for (const t of problem.tasks) {
    const u = alloc[t.name] ?? 0;
    if (!Number.isInteger(u) || u < 0) out.push(`${t.name}: ${u} is not a non-negative integer`);
    if (u > t.max_units) out.push(`${t.name}: ${u} > max_units ${t.max_units}`);
    if (u < t.min_units) out.push(`${t.name}: ${u} < min_units ${t.min_units}`);
    for (const [r, d] of Object.entries(t.demand_per_unit)) used[r] += d * u;
  }
  for (const r of problem.resources) {
    if (used[r.name] > r.capacity) out.push(`${r.name}: uses ${used[r.name]} > capacity ${r.capacity}`);
  }
  for (const [a, b] of problem.exclusive_pairs) {
    if ((alloc[a] ?? 0) > 0 && (alloc[b] ?? 0) > 0) out.push(`${a} and ${b} are exclusive`);
  }
  return out;
}

/**
 * Greedy allocation: required minimums first, then one unit at a time to the task with the highest value per
 * unit that still fits (capacities, max_units, exclusive pairs).
 * @param {object} problem - Problem.to_dict() shape.
 * @returns {object} Task name -> units.
 */
function greedy(problem) {
  const alloc = {};
  for (const t of problem.tasks) alloc[t.name] = t.min_units;
  const order = [...problem.tasks].sort((a, b) => b.value_per_unit - a.value_per_unit);
  for (;;) {
    const next = order.find((t) => {
      const trial = { ...alloc, [t.name]: alloc[t.name] + 1 };
      return violations(problem, trial).length === 0;
    });
    if (!next) return alloc;
    alloc[next.name] += 1;
  }
}

/**
 * The executor's action text: the plan if it is feasible, else the greedy allocation.
 * @param {object} problem - Problem.to_dict() shape.
 * @param {object|null} plan - The leader's plan (task -> units) or null.
 * @returns {{text: string, allocation: object, followedPlan: boolean}} Action text ("task_1: 2" lines).
 */
function act(problem, plan) {
  const followedPlan = Boolean(plan) && violations(problem, plan).length === 0;
  const allocation = followedPlan ? plan : greedy(problem);
  const text = problem.tasks.map((t) => `${t.name}: ${allocation[t.name] ?? 0}`).join('\n');
  return { text, allocation, followedPlan };
}

module.exports = { act, greedy, violations };
