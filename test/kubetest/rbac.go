package kubetest

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceAccountToken creates the service account namespace/name (and its namespace, if
// missing), binds it to the ClusterRole role and returns a token for it. With rules, the
// ClusterRole is created with them; without, it must exist. The binding is named after the
// service account.
func (c *Cluster) ServiceAccountToken(ctx context.Context, namespace, name, role string, rules []rbacv1.PolicyRule) (string, error) {
	cs := c.Clientset
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create service account %s/%s: %w", namespace, name, err)
	}
	if rules != nil {
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			return "", fmt.Errorf("create ClusterRole %s: %w", role, err)
		}
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: namespace, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create ClusterRoleBinding %s: %w", name, err)
	}
	return c.TokenFor(ctx, namespace, name)
}

// BindRole creates role in its namespace and binds it to the service account
// saNamespace/saName with a RoleBinding of the same name.
func (c *Cluster) BindRole(ctx context.Context, role *rbacv1.Role, saNamespace, saName string) error {
	cs := c.Clientset
	if _, err := cs.RbacV1().Roles(role.Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Role %s/%s: %w", role.Namespace, role.Name, err)
	}
	if _, err := cs.RbacV1().RoleBindings(role.Namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: role.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: saNamespace, Name: saName}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create RoleBinding %s/%s: %w", role.Namespace, role.Name, err)
	}
	return nil
}
