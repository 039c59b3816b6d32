"""The seed's pipeline as Business Logic Scripting: this model calls add_sub, then mul, through
the server (`pb_utils.InferenceRequest(...).exec()`), and answers OUTPUT = (a+b)*(a-b), as the
`ensemble` model does."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            add_sub = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[pb_utils.Tensor("add_sub_input0", a), pb_utils.Tensor("add_sub_input1", b)],
                requested_output_names=["added_output", "subbed_output"],
            ).exec()
            if add_sub.has_error():
                raise pb_utils.TritonModelException(add_sub.error().message())
            added = pb_utils.get_output_tensor_by_name(add_sub, "added_output").as_numpy()
            subbed = pb_utils.get_output_tensor_by_name(add_sub, "subbed_output").as_numpy()
            mul = pb_utils.InferenceRequest(
                model_name="mul",
                inputs=[
                    pb_utils.Tensor("mul_input0", added),
                    pb_utils.Tensor("mul_input1", subbed),
                ],
                requested_output_names=["mul_output"],
            ).exec()
            if mul.has_error():
                responses.append(pb_utils.InferenceResponse(error=mul.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(mul, "mul_output").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
